"""Folding a flush's rows by key for the upsert sinks (``mode = "upsert"``,
docs/cdc.md): each key's row of the highest lane position, in Arrow, before anything is
sent — the destination then holds at most one row per key per flush to apply."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.records import unavailable
from thalweg.records.columns import MetadataColumns
from thalweg.sinks.base import SinkRefusedError, SinkSchemaError, name_records

DELETED = "__deleted"  # a change event's delete (codecs/envelope.py)


def newest_per_key(
    data: pa.Table,
    key: list[str],
    topic: str,
    sink: str,
    columns: MetadataColumns,
    *,
    keep_value: bool = True,
) -> pa.Table:
    """Each key's row of the highest lane position. A delete without every key column
    (a tombstone with no image) names no row and is left out; any other row without
    one (an update whose image lacks the key) is refused, named. Rows read with their
    value (an upsert by the record key) are deletes where the value is null
    (:func:`with_deletes`).

    Raises:
        SinkRefusedError: rows that are not deletes lack a key value (set aside in the
            sink's dead-letter lane, the rest lands).
        SinkSchemaError: the rows have no position.
    """
    position = columns.position
    data = with_deletes(data, columns.value, keep_value=keep_value)
    if position not in data.column_names:
        raise SinkSchemaError(f"sink {sink!r}: the rows of {topic!r} have no {position}")
    missing = [k for k in key if k not in data.column_names]
    known = (
        pa.array([False] * data.num_rows)
        if missing
        else functools.reduce(pc.and_, [pc.is_valid(data.column(k)) for k in key])
    )
    nameless = pc.and_(pc.invert(known), pc.invert(deleted(data)))
    if pc.any(nameless).as_py():
        poison = data.filter(nameless)
        raise SinkRefusedError(
            f"sink {sink!r}: {poison.num_rows} row(s) of {topic!r} have no value for the "
            f"key column(s) {key} (mode = 'upsert' names a row by them)",
            records=_records(poison, topic, columns),
        )
    if missing:
        return data.slice(0, 0)  # deletes only, naming no row: nothing to fold
    data = data.filter(known)
    top = data.group_by(key).aggregate([(position, "max")])
    top = top.rename_columns([*key, position])  # the keys, then the aggregate
    # Joined on a slim table (Arrow joins no struct columns), then taken whole.
    rows = numbered(data, key, position).join(top, [*key, position], join_type="inner")
    # The columns a change event did not carry keep the key's current value.
    return unavailable.from_flush(data, taken(data, rows.column(ROW)), key, position)


def _records(
    rows: pa.Table, topic: str, columns: MetadataColumns
) -> dict[tuple[str, int], set[int]] | None:
    """The records of ``rows``; None without the partition column (the feeder then
    finds them by halving)."""
    if columns.partition not in rows.column_names:
        return None
    out: dict[tuple[str, int], set[int]] = {}
    name_records(out, topic, rows, columns)
    return out


def with_deletes(data: pa.Table, value: str, *, keep_value: bool) -> pa.Table:
    """A plain keyed changelog's deletes: rows that came with their ``value`` column but
    without a change event's ``__deleted`` get one, true for a tombstone (a null value).
    The value's bytes are then dropped unless the sink's ``metadata`` asked for them."""
    if value not in data.column_names:
        return data
    if DELETED not in data.column_names:
        data = data.append_column(DELETED, pc.is_null(data.column(value)))
    return data if keep_value else data.drop_columns([value])


ROW = "_thalweg_row"  # a row's index, through a join


def numbered(data: pa.Table, key: list[str], position: str) -> pa.Table:
    """The key columns and the ``position`` column of ``data``, with each row's index."""
    slim = data.select([*key, position])
    return slim.append_column(ROW, pa.array(np.arange(data.num_rows, dtype=np.int64)))


def taken(data: pa.Table, rows: pa.ChunkedArray) -> pa.Table:
    """The rows of ``data`` at ``rows``, in lane order."""
    return data.take(pc.take(rows, pc.sort_indices(rows)))


def deleted(rows: pa.Table) -> pa.Array | pa.ChunkedArray:
    """Which rows are a change event's delete (``__deleted``; none without it)."""
    if DELETED not in rows.column_names:
        return pa.array([False] * rows.num_rows)
    return pc.fill_null(rows.column(DELETED), False)
