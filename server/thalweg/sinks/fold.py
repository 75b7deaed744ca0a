"""Folding a flush's rows by key for the upsert sinks (``mode = "upsert"``,
docs/cdc.md): each key's row of the highest lane position, in Arrow, before anything is
sent — the destination then holds at most one row per key per flush to apply."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.sinks.base import SinkSchemaError

POSITION = "_twg_position"
DELETED = "__deleted"  # a change event's delete (codecs/envelope.py)


def newest_per_key(data: pa.Table, key: list[str], topic: str, sink: str) -> pa.Table:
    """Each key's row of the highest lane position; rows without every key column (a
    tombstone with no image) are left out.

    Raises:
        SinkSchemaError: the rows lack a key column or the position.
    """
    missing = [c for c in [*key, POSITION] if c not in data.column_names]
    if missing and DELETED in data.column_names and pc.all(data.column(DELETED)).as_py():
        return data.slice(0, 0)  # tombstones only: no key known, nothing to fold
    if missing:
        raise SinkSchemaError(
            f"sink {sink!r}: mode = 'upsert' needs the column(s) {missing} in the rows of {topic!r}"
        )
    known = functools.reduce(pc.and_, [pc.is_valid(data.column(k)) for k in key])
    data = data.filter(known)
    top = data.group_by(key).aggregate([(POSITION, "max")])
    top = top.rename_columns([*key, POSITION])  # the keys, then the aggregate
    # Joined on a slim table (Arrow joins no struct columns), then taken whole.
    rows = numbered(data, key).join(top, [*key, POSITION], join_type="inner")
    return taken(data, rows.column(ROW))


ROW = "_thalweg_row"  # a row's index, through a join


def numbered(data: pa.Table, key: list[str]) -> pa.Table:
    """The key columns and the position of ``data``, with each row's index."""
    slim = data.select([*key, POSITION])
    return slim.append_column(ROW, pa.array(np.arange(data.num_rows, dtype=np.int64)))


def taken(data: pa.Table, rows: pa.ChunkedArray) -> pa.Table:
    """The rows of ``data`` at ``rows``, in lane order."""
    return data.take(pc.take(rows, pc.sort_indices(rows)))


def deleted(rows: pa.Table) -> pa.Array | pa.ChunkedArray:
    """Which rows are a change event's delete (``__deleted``; none without it)."""
    if DELETED not in rows.column_names:
        return pa.array([False] * rows.num_rows)
    return pc.fill_null(rows.column(DELETED), False)
