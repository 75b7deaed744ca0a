"""The ``latest`` view of a keyed topic (ticket ``"view": "latest"``, docs/cdc.md): one
row per record key, the newest by lane position, deleted keys absent.

A key's records share a partition (that is what a keyed topic means to its producer),
so each partition folds alone: the rows of the read arrive partition by partition in
position order, and the fold keeps, per ``(partition, key)``, the row of the highest
position. A key is deleted when that row is a tombstone (a null value) or a change
event's delete (``__deleted``). Rows without a key name no row and are left out, as are
records that failed to decode (they are in the dead-letter lane).

The fold runs as the rows arrive, a step at a time, so memory holds about one row per
key plus one step, never the whole history.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.errors import InvariantError
from thalweg.flight.read.tickets import ReadTicket
from thalweg.records import unavailable
from thalweg.records.columns import MetadataColumns, MetadataPolicy

STEP_ROWS = 1_048_576  # arriving rows folded alone, a step at a time
STEP_BYTES = 128 * 1024 * 1024
FOLD_ROWS = 1_048_576  # the folded steps folded together again past this many rows
DELETED = "__deleted"  # a change event's delete (codecs/envelope.py)
_ROW = "_thalweg_row"


def fold_input(
    read: ReadTicket, sent: pa.Schema, columns: MetadataColumns, payload: pa.Schema
) -> ReadTicket:
    """What the latest view reads to fold (a ``do_get`` ticket's view and Flight SQL's
    ``latest`` table alike): the columns it answers with (``sent``) and the key, value,
    partition, position and decode error of each row — not every metadata column (all
    of them made the view read twice as slow)."""
    fold = [columns.source("key"), columns.value, columns.partition, columns.position]
    fold.append(columns.decode_error)
    if DELETED in payload.names:  # a change event's delete, where the topic has them
        fold.append(DELETED)
    if unavailable.UNAVAILABLE in payload.names:  # columns the events did not carry
        fold.append(unavailable.UNAVAILABLE)
    wanted = list(dict.fromkeys([*sent.names, *fold]))
    return read.model_copy(update={"metadata": MetadataPolicy.ALL, "columns": wanted})


def fold_latest(
    batches: Iterable[pa.RecordBatch], columns: MetadataColumns, *, values: bool = True
) -> pa.Table | None:
    """Each key's newest row of ``batches`` (decoded rows with the key, value, partition,
    position and decode-error columns), deleted keys left out; None when no batch came.

    Each partition folds alone (a key is hashed without its partition, on one thread:
    grouping by partition and key on Arrow's threads cost twice as much). Arriving rows
    are folded a step at a time (``STEP_ROWS``/``STEP_BYTES``), each step alone, so no
    row is hashed again for every step; the steps' winners are folded together once
    they hold ``FOLD_ROWS`` rows, so memory stays about one row per key plus a step.
    The steps are large: one hash over a million rows cost less than four over a
    quarter each, even with those overlapping the read (one partition: 0.70x DuckDB
    with 256 k-row steps, 0.93-0.97x with one). Without ``values`` the
    value's bytes are kept only as whether they were null (a tombstone): a reader that
    did not ask for them should not have every payload held while the fold runs.
    """
    steps: dict[int, list[pa.Table]] = {}  # each partition's folded steps, in order
    waiting: dict[int, list[pa.Table]] = {}  # rows not folded yet
    rows_waiting = bytes_waiting = held = 0
    limit = FOLD_ROWS
    after: dict[int, int] = {}  # each partition's last position so far
    schema: pa.Schema | None = None
    for arrived in batches:
        batch = arrived if values else _value_as_tombstone(arrived, columns)
        schema = batch.schema
        for partition, rows in _by_partition(batch, columns.partition):
            _in_order(rows, columns.position, partition, after)
            waiting.setdefault(partition, []).append(rows)
        rows_waiting += batch.num_rows
        bytes_waiting += batch.nbytes
        if rows_waiting < STEP_ROWS and bytes_waiting < STEP_BYTES:
            continue
        for partition, parts in waiting.items():
            step = _fold(parts, columns)
            steps.setdefault(partition, []).append(step)
            held += step.num_rows
        waiting, rows_waiting, bytes_waiting = {}, 0, 0
        if held >= limit:
            steps = {p: [_fold(t, columns)] for p, t in steps.items()}
            held = sum(t[0].num_rows for t in steps.values())
            limit = max(FOLD_ROWS, 2 * held)  # more keys than FOLD_ROWS: fold less often
    if schema is None:
        return None
    parts_of = {p: [*steps.get(p, []), *waiting.get(p, [])] for p in sorted({*steps, *waiting})}
    if not parts_of:
        return schema.empty_table()
    newest = pa.concat_tables(
        [_fold(parts, columns) for parts in parts_of.values()], promote_options="permissive"
    )
    return newest.filter(pc.invert(_deleted(newest, columns, values=values)))


def _value_as_tombstone(batch: pa.RecordBatch, columns: MetadataColumns) -> pa.RecordBatch:
    """``batch`` with its value column replaced by whether the value was null (named
    under the metadata prefix: no payload field can have that name).

    Raises:
        InvariantError: the rows have no value column (the read always asks for it).
    """
    at = batch.schema.get_field_index(columns.value)
    if at < 0:
        raise InvariantError("the latest view's rows came without their value column")
    gone = pc.is_null(batch.column(at))
    return batch.remove_column(at).append_column(_tombstone(columns), gone)


def _tombstone(columns: MetadataColumns) -> str:
    return columns.prefix + "fold_tombstone"


def _by_partition(batch: pa.RecordBatch, column: str) -> Iterator[tuple[int, pa.Table]]:
    """``batch``'s rows by partition (a read's batch is almost always one partition's)."""
    if not batch.num_rows:
        return
    parts = batch.column(column)
    bounds = pc.min_max(parts)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low == high:
        yield int(low), pa.Table.from_batches([batch])
        return
    for p in pc.unique(parts).to_pylist():
        yield int(p), pa.Table.from_batches([batch.filter(pc.equal(parts, p))])


def _in_order(rows: pa.Table, position: str, partition: int, after: dict[int, int]) -> None:
    """The fold keeps a key's *last* row, so a partition's rows must come in position
    order, within a batch and from one batch to the next; a read that broke it would
    give a wrong table, never silently (one vectorised pass a batch).

    Raises:
        InvariantError: ``rows`` go back, or start at or before a position this
            partition had.
    """
    positions = rows.column(position).to_numpy()
    before = after.get(partition)
    if (before is not None and positions[0] <= before) or (np.diff(positions) <= 0).any():
        raise InvariantError(
            f"latest view: partition {partition}'s rows came out of position order "
            f"(after {before}: {positions[:3].tolist()}…)"
        )
    after[partition] = int(positions[-1])


def _fold(parts: list[pa.Table], columns: MetadataColumns) -> pa.Table:
    """One partition's newest row per key, in position order; rows without a key, or
    that failed to decode, left out.

    A partition's rows come in position order (a read yields each partition's rows
    ascending, and ``parts`` holds the earlier fold's rows first), so a key's newest
    row is its last: the highest row number — a hash ``max`` over the key and the row
    number, with no join back on the position (the join was a third of the fold).
    The winners are then kept whole.
    """
    rows = pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]
    key = rows.column(columns.source("key"))
    usable = pc.is_valid(key)
    if columns.decode_error in rows.column_names:
        usable = pc.and_(usable, pc.is_null(rows.column(columns.decode_error)))
    slim = pa.table({"k": key, _ROW: pa.array(np.arange(rows.num_rows), pa.int64())})
    if not pc.all(usable).as_py():  # usually every row is: no filter pass then
        slim = slim.filter(usable)
    top = slim.group_by(["k"], use_threads=False).aggregate([(_ROW, "max")])
    # Kept by a mask, not taken by index: the winners stay in position order with no
    # sort, and a filter of the wide rows cost half a take (1 M rows, 10 % kept).
    keep = np.zeros(rows.num_rows, dtype=np.bool_)
    keep[top.column(f"{_ROW}_max").to_numpy()] = True
    newest = rows.filter(pa.array(keep))
    if unavailable.UNAVAILABLE not in rows.column_names:
        return newest
    # The columns a change event did not carry keep the key's last value: the earlier
    # rows here (a step, or the earlier steps' winners before this step's rows).
    name = columns.source("key")
    return unavailable.from_flush(rows.filter(usable), newest, [name], columns.position)


def _deleted(
    rows: pa.Table, columns: MetadataColumns, *, values: bool
) -> pa.ChunkedArray | pa.Array:
    """Tombstones (a null value, or its flag when the bytes were not kept) and change
    events' deletes."""
    gone = pc.is_null(rows.column(columns.value)) if values else rows.column(_tombstone(columns))
    if DELETED in rows.column_names:
        gone = pc.or_(gone, pc.fill_null(rows.column(DELETED), False))
    return gone
