"""What a table read from a file must be before its rows reach the lanes: every column
under a name of its own, and of a type the Parquet lanes can hold.

A decoded row is a mapping from names, so two columns of one name would keep one value
and drop the other; and a column Parquet cannot hold (an interval, a union) would make
the decoded lane's writer fail on every retry, holding the run. Run-end encoded columns
are decoded (the same values); the other such types are refused with the file, by name.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from thalweg.errors import ThalwegError


class UnstorableColumnsError(ThalwegError):
    """Columns of types the Parquet lanes cannot hold (the file is reported unreadable)."""

    retriable = False


def unique_names(names: list[str]) -> list[str]:
    """Names every column can keep its values under: an empty name becomes ``f<i>``
    (its position, as for a file without a header) and a repeated one ``<name>_2``,
    ``<name>_3`` … (the first free)."""
    taken = set(names)
    out: list[str] = []
    seen: set[str] = set()
    for i, name in enumerate(names):
        base = name or f"f{i}"
        new, k = base, 2
        while new in seen or (new != name and new in taken):
            new, k = f"{base}_{k}", k + 1
        seen.add(new)
        out.append(new)
    return out


def lane_ready(table: pa.Table, checked: set[pa.Schema]) -> pa.Table:
    """``table`` with unique column names and run-end encoded columns decoded.
    ``checked`` holds the schemas already known to be storable (one trial write of an
    empty table per new schema: a fraction of a millisecond).

    Raises:
        UnstorableColumnsError: a column Parquet cannot hold, named with its type.
    """
    names = table.column_names
    if len(set(names)) < len(names) or not all(names):
        table = table.rename_columns(unique_names(names))
    for i, f in enumerate(table.schema):
        if pa.types.is_run_end_encoded(f.type):
            chunks = [pc.run_end_decode(c) for c in table.column(i).chunks]
            decoded = pa.field(f.name, f.type.value_type, f.nullable, f.metadata)
            table = table.set_column(i, decoded, pa.chunked_array(chunks, decoded.type))
    if table.schema not in checked:
        sample = table.slice(0, _SAMPLE_ROWS)
        bad = [
            f"{f.name} ({f.type})"
            for i, f in enumerate(table.schema)
            if not _storable(sample.select([i]))
        ]
        if bad:
            raise UnstorableColumnsError(
                f"column {', '.join(bad)}: a type the Parquet lanes cannot hold; "
                "cast it before loading (to a plain, struct or string type)"
            )
        checked.add(table.schema)
    return table


_SAMPLE_ROWS = 16  # some types fail only with values (a dictionary of structs)


def _storable(sample: pa.Table) -> bool:
    """Whether Parquet takes the column, tried with an empty table and a few rows."""
    try:
        pq.write_table(sample.schema.empty_table(), io.BytesIO())
        if sample.num_rows:
            pq.write_table(sample, io.BytesIO())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return False
    return True
