"""Keeping the current value of the columns a change event did not carry
(``__unavailable``: Debezium's unavailable-value placeholder, set aside by
``codecs/unavailable.py``).

A key's newest row names the columns the connector could not read; their value is the
key's current one: the last value an earlier event of the key carried since it was last
deleted. Within a flush that is the flush's own earlier rows (:func:`from_flush`,
every upsert sink and the latest view's fold); what the flush cannot resolve comes from
the row the destination holds for the key (:func:`from_held`: Iceberg and Delta read
it, Postgres fills it in SQL). A column still unknown after both (the key's row never
had a value for it in what the destination saw) stays null and stays named in
``__unavailable``: the placeholder itself never lands.

The fill is per column named, on whole columns (joins on the key), so a flush without
the column pays one null check.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

UNAVAILABLE = "__unavailable"
PLACEHOLDER = "__debezium_unavailable_value"  # the connector's default
DELETED = "__deleted"
_ROW, _AT, _GONE = "_thalweg_fill_row", "_thalweg_fill_at", "_thalweg_fill_gone"


def named(rows: pa.Table) -> list[str]:
    """The columns some row of ``rows`` names as unavailable."""
    if UNAVAILABLE not in rows.column_names or rows.column(UNAVAILABLE).null_count == rows.num_rows:
        return []
    flat = pc.list_flatten(rows.column(UNAVAILABLE))
    return sorted(str(c) for c in pc.unique(flat).to_pylist() if c is not None)


def unresolved(rows: pa.Table) -> pa.Table:
    """The rows that still name a column as unavailable (and are not deletes)."""
    if not named(rows):
        return rows.slice(0, 0)
    keep = pc.is_valid(rows.column(UNAVAILABLE))
    if DELETED in rows.column_names:
        keep = pc.and_(keep, pc.invert(pc.fill_null(rows.column(DELETED), False)))
    return rows.filter(keep)


def from_flush(rows: pa.Table, newest: pa.Table, key: list[str], position: str) -> pa.Table:
    """``newest`` (each key's newest row of ``rows``) with the columns it names as
    unavailable taken from the key's last earlier row of ``rows`` that carried them, since
    the key's last delete in ``rows``. A key deleted earlier in the flush and not carrying
    the column since has no current value for it: null, no longer named (its row was
    gone, so the destination's older row must not fill it)."""
    columns = [c for c in named(newest) if c in rows.column_names]
    if not columns:
        return newest
    marks = {c: _names(newest, c) for c in named(newest)}
    slim = _numbered(rows, key, position)
    gone = _deleted(rows)
    deletes = slim.filter(gone).group_by(key).aggregate([(position, "max")])
    deletes = deletes.rename_columns([*key, _GONE])
    # The rows since each key's last delete, and whether the key had one: the same for
    # every column named, so joined once.
    alive = slim.filter(pc.invert(gone)).join(deletes, key, join_type="left outer")
    since = pc.or_kleene(
        pc.is_null(alive.column(_GONE)), pc.greater(alive.column(position), alive.column(_GONE))
    )
    alive = alive.filter(since)
    winners = _numbered(newest, key, position).join(deletes, key, join_type="left outer")
    winners = winners.sort_by(_ROW)
    was_deleted = np.asarray(winners.column(_GONE).is_valid())
    winners = winners.select([*key, position, _ROW])
    for c in columns:
        carried = alive.filter(pa.array(~_names(rows, c)[alive.column(_ROW).to_numpy()]))
        last = carried.group_by(key).aggregate([(position, "max")])
        last = last.rename_columns([*key, _AT])
        pick = carried.join(
            last, [*key, position], right_keys=[*key, _AT], join_type="inner"
        ).select([*key, _ROW])
        found = winners.join(pick.rename_columns([*key, "_src"]), key, join_type="left outer")
        source = found.sort_by(_ROW).column("_src")
        wanted = marks[c]
        has = np.asarray(source.is_valid()) & wanted
        values = pc.take(rows.column(c), source)
        at = newest.schema.get_field_index(c)
        newest = newest.set_column(at, c, pc.if_else(pa.array(has), values, newest.column(c)))
        marks[c] = wanted & ~has & ~was_deleted
    return _marked(newest, marks)


def from_held(newest: pa.Table, held: pa.Table, key: list[str], position: str) -> pa.Table:
    """``newest`` with the columns it still names as unavailable taken from ``held``
    (the destination's rows of those keys, older than ``newest``'s); a column ``held``
    has no row or no value for stays null and named (the held row's own ``__unavailable``
    passes on)."""
    columns = named(newest)
    if not columns or not held.num_rows:
        return newest
    marks = {c: _names(newest, c) for c in columns}
    for k in key:  # the destination's key type may be wider than the flush's
        if held.schema.field(k).type != newest.schema.field(k).type:
            at = held.schema.get_field_index(k)
            held = held.set_column(at, k, held.column(k).cast(newest.schema.field(k).type))
    held = _last_per_key(held, key, position)
    winners = _numbered(newest, key, position)
    rows = _numbered(held, key, position).rename_columns([*key, _AT, "_src"])
    found = winners.join(rows, key, join_type="left outer").sort_by(_ROW)
    source = found.column("_src")
    older = pc.fill_null(pc.less(found.column(_AT), found.column(position)), False)
    valid = np.asarray(older.to_numpy(zero_copy_only=False), dtype=bool)
    for c in columns:
        if c not in held.column_names:
            continue
        has = valid & marks[c]
        if not has.any():
            continue
        values = pc.take(held.column(c), source)
        if c in newest.column_names:
            at = newest.schema.get_field_index(c)
            target = newest.column(c)
            if target.type != values.type:
                values = values.cast(target.type)
            newest = newest.set_column(at, c, pc.if_else(pa.array(has), values, target))
        still = _names(held, c)[np.asarray(pc.fill_null(source, 0))]
        marks[c] = marks[c] & ~(has & ~still)
    return _marked(newest, marks)


def names_per_row(marks: dict[str, np.ndarray], n: int) -> pa.Array:
    """A list of column names per row (null where no mask holds the row)."""
    names = list(marks)
    matrix = np.stack([marks[c] for c in names])  # columns x rows
    counts = matrix.sum(axis=0)
    rows, cols = np.nonzero(matrix.T)  # by row, then column: each row's names in order
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    values = pa.array(np.asarray(names, dtype=object)[cols] if len(rows) else [], pa.string())
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=pa.array(counts == 0))


def _marked(rows: pa.Table, marks: dict[str, np.ndarray]) -> pa.Table:
    """``rows`` with ``__unavailable`` naming per row the columns ``marks`` holds."""
    held = {c: m for c, m in marks.items() if m.any()}
    value = (
        names_per_row(held, rows.num_rows)
        if held
        else pa.nulls(rows.num_rows, pa.list_(pa.string()))
    )
    at = rows.schema.get_field_index(UNAVAILABLE)
    return rows.set_column(at, UNAVAILABLE, value)


def _names(rows: pa.Table, column: str) -> np.ndarray:
    """Which rows name ``column`` in ``__unavailable``."""
    out = np.zeros(rows.num_rows, dtype=bool)
    if UNAVAILABLE not in rows.column_names:
        return out
    lists = rows.column(UNAVAILABLE).combine_chunks()
    flat = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    hit = np.asarray(pc.fill_null(pc.equal(flat, column), False).to_numpy(zero_copy_only=False))
    out[parents[hit]] = True
    return out


def _last_per_key(rows: pa.Table, key: list[str], position: str) -> pa.Table:
    """Each key's row of the highest ``position`` (a destination holds one per key; a
    second would make the join answer a row twice)."""
    rows = rows.sort_by(position)
    top = _numbered(rows, key, position).group_by(key, use_threads=False)
    last = top.aggregate([(_ROW, "max")]).column(f"{_ROW}_max")
    if len(last) == rows.num_rows:
        return rows
    return rows.take(pa.array(np.sort(last.to_numpy(zero_copy_only=False))))


def _numbered(rows: pa.Table, key: list[str], position: str) -> pa.Table:
    slim = rows.select([*key, position])
    return slim.append_column(_ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64)))


def _deleted(rows: pa.Table) -> pa.Array:
    if DELETED not in rows.column_names:
        return pa.array(np.zeros(rows.num_rows, dtype=bool))
    return pc.fill_null(rows.column(DELETED), False).combine_chunks()
