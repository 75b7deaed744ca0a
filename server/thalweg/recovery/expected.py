"""Which positions a sink's destination should hold, and which it does, from the lanes.

One answer for the two that ask: ``twg verify`` (``verify/sinks.py``) names what is
missing, twice or extra; the running feeder (``recovery/recheck.py``) feeds again what
was deleted behind its back. Both ask the lane the same way, so the feeder never re-feeds
what verify would not call missing:

* a decoded sink holds the positions that decoded (the twin's rows with no decode
  error), a raw sink (``raw = true``) every raw row;
* less the records the destination refused for good (the sink's dead-letter lane);
* an upsert sink (``mode = "upsert"``) only each key's newest row that is not a delete
  (:func:`folded`, the fold of the lane, docs/cdc.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from thalweg.config.sinks import Upserts
from thalweg.lane.layout import Lane, LaneLayout
from thalweg.records.columns import MetadataColumns
from thalweg.sinks import routes
from thalweg.sinks.fold import DELETED, with_deletes

ROUTED = "_thalweg_table"  # the table a routed row names, beside its key


def lane_positions(
    layout: LaneLayout,
    columns: MetadataColumns,
    topic: str,
    partition: int,
    window: list[tuple[int, int]],
    *,
    raw: bool,
) -> np.ndarray:
    """The positions inside ``window`` the lane gives a sink a row for, ascending: every
    raw row (``raw``), or the rows whose decoded twin holds them without a decode error
    (a segment whose twin is missing gives none: which of its records decoded is not
    known until it is decoded again)."""
    decoded_dir = layout.partition_dir(Lane.DECODED, topic, partition)
    decoded = not raw and layout.has_decoded(topic)
    position, error = columns.position, columns.decode_error
    found = []
    for seg in layout.segments(Lane.RAW, topic, partition):
        if not any(seg.first < b and a <= seg.last for a, b in window):
            continue
        path = decoded_dir / seg.path.name if decoded else seg.path
        if not path.exists():
            continue
        names = pq.read_schema(path).names
        table = pq.read_table(path, columns=[c for c in (position, error) if c in names])
        if decoded and error in names:
            table = table.filter(pc.is_null(table.column(error)))
        found.append(table.column(position).to_numpy(zero_copy_only=False).astype(np.int64))
    return inside(np.concatenate(found), window) if found else np.zeros(0, np.int64)


def folded(
    layout: LaneLayout,
    sink_cfg: Upserts,
    columns: MetadataColumns,
    topic: str,
    partition: int,
    want: np.ndarray,
) -> np.ndarray:
    """Of the positions ``want`` (the decoded rows inside the coverage), those an upsert
    sink keeps: per table and key the newest, unless it is a delete (``__deleted``, or
    keyed by the record key a tombstone); rows without every key column change nothing.

    Folded as the sink folds (``sinks.fold``): a routed sink (``"{tenant}_orders"``)
    folds each table alone, so the table a row names is part of its key here. The rows
    come from ``layout`` (verify passes the lanes as audited: a bucket's fetched copy,
    not the local cache, which may hold part of it)."""
    key = sink_cfg.row_key(columns.source("key"))
    template = getattr(sink_cfg, "table", "")
    routing = routes.fields(template)
    wanted = list(dict.fromkeys([*key, *routing, columns.position, DELETED]))
    if sink_cfg.record_keyed:
        wanted.append(columns.value)
    parts = []
    for seg in layout.segments(Lane.RAW, topic, partition):
        twin = layout.partition_dir(Lane.DECODED, topic, partition) / seg.path.name
        if twin.exists():
            parts.append(segment_columns(seg.path, twin, wanted, columns))
    rows = pa.concat_tables(parts, promote_options="permissive") if parts else None
    if rows is None or any(k not in rows.column_names for k in key):
        return np.zeros(0, np.int64)  # no row names a key (tombstones only)
    positions = rows.column(columns.position).to_numpy(zero_copy_only=False)
    rows = with_deletes(
        rows.filter(pa.array(np.isin(positions, want))), columns.value, keep_value=False
    )
    if routing:
        named, _ = routes.names(rows, template, topic)
        rows = rows.append_column(ROUTED, named)
        key = [*key, ROUTED]
    for k in key:
        rows = rows.filter(pc.is_valid(rows.column(k)))
    if not rows.num_rows:
        return np.zeros(0, np.int64)
    top = rows.group_by(key).aggregate([(columns.position, "max")])
    newest = top.column(top.num_columns - 1).to_numpy(zero_copy_only=False)
    if DELETED in rows.column_names:
        gone = rows.filter(pc.fill_null(rows.column(DELETED), False)).column(columns.position)
        newest = absent(newest, gone.to_numpy(zero_copy_only=False))
    return np.sort(newest.astype(np.int64))


def absent(want: np.ndarray, got: np.ndarray) -> np.ndarray:
    """The positions of ``want`` (unique) that ``got`` (any order, repeats allowed)
    lacks, in ``want``'s order. Not ``np.setdiff1d``: numpy 2's hashed ``unique`` under
    it took 1.9 s for a million positions against a million unordered ones (this: 0.01 s;
    a recheck of a million-row table went from 2.7 s to under 0.3 s)."""
    return want[~np.isin(want, got)]


def segment_columns(raw: Path, twin: Path, wanted: list[str], columns: MetadataColumns) -> pa.Table:
    """A segment's decoded rows with the ``wanted`` columns it has: from the decoded
    twin, and those only the raw segment holds (the record key, the value, any
    ``_twg_source_`` column) matched to them by position."""
    held = set(pq.read_schema(twin).names)
    rows = pq.read_table(twin, columns=[c for c in wanted if c in held])
    rest = [c for c in wanted if c not in held and c != columns.position]
    rest = [c for c in rest if c in pq.read_schema(raw).names]
    if not rest:
        return rows
    extra = pq.read_table(raw, columns=[columns.position, *rest])
    at = pc.index_in(rows.column(columns.position), extra.column(columns.position))
    for c in rest:
        rows = rows.append_column(c, pc.take(extra.column(c), at))
    return rows


def of_topic(table: pa.Table | None, columns: MetadataColumns, topic: str) -> pa.Table | None:
    """The rows of ``topic`` in a destination's rows (a table several topics share)."""
    name = columns.source("topic")
    if table is None or name not in table.column_names:
        return table
    return table.filter(pc.equal(table.column(name), topic))


def held_positions(
    table: pa.Table, columns: MetadataColumns, partition: int, window: list[tuple[int, int]]
) -> np.ndarray:
    """The positions of ``partition``'s rows in a destination's ``table`` inside
    ``window`` (a position twice stays twice: verify counts duplicates)."""
    rows = table.filter(pc.equal(table.column(columns.partition), partition))
    pos = rows.column(columns.position).to_numpy(zero_copy_only=False).astype(np.int64)
    return inside(pos, window)


def inside(positions: np.ndarray, ranges: list[tuple[int, int]]) -> np.ndarray:
    """The ``positions`` inside the half-open ``ranges``."""
    keep = np.zeros(len(positions), dtype=bool)
    for a, b in ranges:
        keep |= (positions >= a) & (positions < b)
    return positions[keep]


def as_ranges(positions: np.ndarray) -> list[tuple[int, int]]:
    """Ascending unique ``positions`` as half-open runs: ``[3, 4, 5, 9]`` → ``[(3, 6),
    (9, 10)]``."""
    if not len(positions):
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1)
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [len(positions) - 1]])
    return [(int(positions[a]), int(positions[b]) + 1) for a, b in zip(starts, ends, strict=True)]
