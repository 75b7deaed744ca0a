"""What a flush's schema changes in a live table's, in Arrow's terms (docs/sinks.md,
"Schema changes"): nothing, an added column, a widening (``int32`` → ``int64``,
``float32`` → ``float64``) or another change — asked before a writer that would cast the
rows silently. delta-rs, asked to append ``float64`` rows to a ``float32`` column or
integers to a ``string`` column, casts them without a word and loses precision or meaning;
a destination that cannot take a change must stop there and name it instead.

A column the table lacks is not a conflict (the destination adds it); one the rows lack is
none either (its cells are null). Representations of one logical type are one type here
(``string`` and ``large_string``, a dictionary and its values, a fixed-size binary and
``binary``), as are a timestamp's units: a destination keeps its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from thalweg.sinks.base import SinkSchemaError


@dataclass(frozen=True, slots=True)
class Conflict:
    """A column whose table type cannot take the rows' type as it is."""

    column: str  # dotted for a nested field ("address.zip"; a list's items "tags[]")
    have: pa.DataType  # the table's
    rows: pa.DataType  # the flush's
    widening: bool  # the rows' type holds every value of the table's (int32 → int64)

    def describe(self) -> str:
        """The column and both types, as an operator reads them in /health and the log."""
        return f"column {self.column!r} is {self.have} in the table, the rows have {self.rows}"


def conflict(table: pa.Schema, rows: pa.Schema) -> Conflict | None:
    """The first column of ``rows`` that ``table`` holds under a type the rows do not fit
    (None: every shared column takes the rows as they are)."""
    for field in rows:
        if field.name in table.names:
            found = _compare(field.name, table.field(field.name).type, field.type)
            if found is not None:
                return found
    return None


def refuse(
    table: pa.Schema, rows: pa.Schema, where: str, *, cannot_widen: str, applied: str
) -> None:
    """Refuse, naming the column and both types, rows a table that cannot widen a
    column (``cannot_widen`` says why) cannot take as they are; ``applied`` says what it
    does take.

    Raises:
        SinkSchemaError: a shared column's type differs beyond a narrower one of its kind.
    """
    found = conflict(table, rows)
    if found is None:
        return
    if found.widening:
        step = (
            f"{cannot_widen}, so the sink stops rather than cast the rows down; rewrite "
            "the table with the wider type"
        )
    else:
        step = f"{applied}; change the table"
    raise SinkSchemaError(
        f'{where}: {found.describe()}; {step} (docs/sinks.md, "Schema changes") and the '
        "sink resumes from its coverage"
    )


def _compare(path: str, have: pa.DataType, rows: pa.DataType) -> Conflict | None:
    have, rows = _plain(have), _plain(rows)
    if have == rows or pa.types.is_null(rows):
        return None
    if pa.types.is_struct(have) and pa.types.is_struct(rows):
        names = [have.field(i).name for i in range(have.num_fields)]
        for i in range(rows.num_fields):
            child = rows.field(i)
            if child.name in names:
                found = _compare(f"{path}.{child.name}", have.field(child.name).type, child.type)
                if found is not None:
                    return found
        return None
    if _is_list(have) and _is_list(rows):
        return _compare(f"{path}[]", have.value_type, rows.value_type)
    if pa.types.is_map(have) and pa.types.is_map(rows):
        return _compare(f"{path}.key", have.key_type, rows.key_type) or _compare(
            f"{path}.value", have.item_type, rows.item_type
        )
    if fits(rows, have):
        return None
    return Conflict(path, have, rows, widening=fits(have, rows))


def fits(narrow: pa.DataType, wide: pa.DataType) -> bool:
    """True when every value of ``narrow`` is a value of ``wide`` (no loss, no reading
    of one kind of value as another)."""
    narrow, wide = _plain(narrow), _plain(wide)
    if narrow == wide:
        return True
    if pa.types.is_integer(narrow) and pa.types.is_integer(wide):
        if pa.types.is_unsigned_integer(wide):
            return bool(pa.types.is_unsigned_integer(narrow) and narrow.bit_width <= wide.bit_width)
        return bool(_signed_bits(narrow) <= wide.bit_width)
    if pa.types.is_floating(narrow) and pa.types.is_floating(wide):
        return bool(narrow.bit_width <= wide.bit_width)
    if pa.types.is_timestamp(narrow) and pa.types.is_timestamp(wide):
        return bool((narrow.tz is None) == (wide.tz is None))
    if pa.types.is_decimal(narrow) and pa.types.is_decimal(wide):
        return bool(narrow.scale == wide.scale and narrow.precision <= wide.precision)
    both = (narrow, wide)
    return all(pa.types.is_date(t) for t in both) or all(pa.types.is_time(t) for t in both)


def _signed_bits(t: pa.DataType) -> int:
    """The bits a signed integer needs to hold every value of ``t``."""
    return int(t.bit_width) + (1 if pa.types.is_unsigned_integer(t) else 0)


def _is_list(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


def _plain(t: pa.DataType) -> pa.DataType:
    """One type for the representations of one logical type."""
    if pa.types.is_dictionary(t):
        return _plain(t.value_type)
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if (
        pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=None if t.tz is None else "UTC")
    return t
