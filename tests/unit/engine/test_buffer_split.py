"""A take is at most a segment's worth: what one fetch brought beyond the roll limits
is written as further full segments, in order, each covering up to where the next
begins, and what is left past the last full one starts the next segment (written at
once only when the buffer is due by age, the partition ended, or everything is asked
for)."""

from __future__ import annotations

import json
import math
from collections import namedtuple
from itertools import pairwise

import pyarrow as pa

from thalweg.codecs.base import DecodeReason
from thalweg.codecs.json import JsonArrowDecoder
from thalweg.config.models import RawLaneConfig
from thalweg.engine.ingest.buffer import PartitionBuffer, Pending
from thalweg.pipeline.decode import decode_batch
from thalweg.records import MetadataColumns, build_raw_batch

COLS = MetadataColumns()
R = namedtuple("R", "topic partition offset timestamp timestamp_type key value headers")


def _raw(offsets: list[int], bad: frozenset[int] = frozenset()) -> pa.RecordBatch:
    recs = [
        R("t", 0, o, 0, 0, None, b"{not json" if o in bad else json.dumps({"id": o}).encode(), ())
        for o in offsets
    ]
    return build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=COLS)


DECODER = JsonArrowDecoder(COLS)


def _buffer(durable: int | None) -> PartitionBuffer:
    return PartitionBuffer.create(
        "t", 0, durable=durable, committed=durable, columns=COLS, decoded=True
    )


def _push(buf: PartitionBuffer, raw: pa.RecordBatch) -> None:
    decoded, result = decode_batch(DECODER, raw, COLS)
    buf.add(raw, decoded, result.failures)


def _positions(p: Pending) -> list[int]:
    return [int(o) for o in p.raw.column(COLS.position).to_pylist()]


def _check_contiguous(pieces: list[Pending]) -> None:
    for before, after in pairwise(pieces):
        assert after.span.covers_from == before.span.covers_to
        assert after.span.first > before.span.last
    for p in pieces:
        got = _positions(p)
        assert (p.span.first, p.span.last, p.span.records) == (got[0], got[-1], len(got))
        assert p.span.covers_from <= p.span.first and p.span.last < p.span.covers_to
        assert p.decoded is not None and p.decoded.num_rows == p.rows


def test_full_segments_are_written_and_the_rest_starts_the_next() -> None:
    # Offsets with gaps (a compacted topic), resumed at 90: the first segment covers
    # from 90, and the segments cover 90..end with no hole and no overlap.
    offsets = [o for o in range(100, 260) if o % 3]  # 107 records
    buf = _buffer(durable=90)
    _push(buf, _raw(offsets, bad=frozenset({101, 190})))
    roll = RawLaneConfig(roll_rows=30)
    now = buf.acc.opened_at  # due by rows, not by age
    assert buf.due(now, roll)
    held = buf.held_rows
    pieces = [buf.take(roll, now)]
    while buf.rest:
        pieces.append(buf.take(roll, now))
    assert [p.rows for p in pieces] == [30, 30, 30]
    assert buf.held_rows == held  # 17 carried, 90 in flight
    assert not buf.empty and not buf.due(now, roll)  # 17 rows: not a segment yet
    assert buf.due(now + roll.roll_age_s, roll)  # the carry's age is its oldest record's
    more = [o for o in range(260, 300) if o % 3]  # 27 more: 44 buffered
    _push(buf, _raw(more))
    assert buf.due(now, roll)
    pieces.append(buf.take(roll, now))
    assert pieces[-1].rows == 30 and buf.carry is not None and buf.carry.rows == 14
    pieces.append(buf.take(roll, math.inf))  # everything: the carry too
    assert buf.empty
    assert pieces[0].span.covers_from == 90
    assert pieces[-1].span.covers_to == more[-1] + 1
    _check_contiguous(pieces)
    assert [o for p in pieces for o in _positions(p)] == offsets + more
    # A failed row's index is its row in its own segment's decoded table.
    failed = [(_positions(p)[f.row], f.reason) for p in pieces for f in p.failures]
    assert [o for o, _ in failed] == [101, 190]
    assert all(r is DecodeReason.SYNTAX for _, r in failed)


def test_a_carry_joined_with_newer_records_keeps_their_failures_in_place() -> None:
    buf = _buffer(durable=None)
    fetched = _raw(list(range(25)), bad=frozenset({22}))
    _push(buf, fetched)
    roll = RawLaneConfig(roll_rows=20)
    now = buf.acc.opened_at
    assert buf.take(roll, now).rows == 20  # 5 carried, one of them failed
    # A slice keeps its whole fetch alive: the carry is charged for all of it.
    assert buf.carry is not None
    assert buf.buffered_bytes >= fetched.get_total_buffer_size()
    _push(buf, _raw(list(range(25, 45)), bad=frozenset({30})))
    joined = buf.take(roll, now)
    assert _positions(joined) == list(range(20, 40))
    assert [_positions(joined)[f.row] for f in joined.failures] == [22, 30]
    assert joined.span.covers_from == 20 and joined.span.covers_to == 40
    buf.take(roll, math.inf)
    assert buf.empty and buf.buffered_bytes == 0  # all of it in flight now


def test_due_by_age_or_everything_writes_the_remainder_too() -> None:
    buf = _buffer(durable=None)
    _push(buf, _raw(list(range(50))))
    roll = RawLaneConfig(roll_rows=20, roll_age_s=1)
    later = buf.acc.opened_at + 1
    pieces = [buf.take(roll, later)]
    while buf.rest:
        pieces.append(buf.take(roll, later))
    assert [p.rows for p in pieces] == [20, 20, 10] and buf.empty
    _check_contiguous(pieces)


def test_the_byte_limit_cuts_too() -> None:
    buf = _buffer(durable=None)
    batch = _raw(list(range(1000)))
    _push(buf, batch)
    roll = RawLaneConfig(roll_bytes=batch.nbytes // 4 + 1)
    sizes = []
    while not buf.empty:
        sizes.append(buf.take(roll, math.inf).rows)
    assert sizes == [250, 250, 250, 250]


def test_a_take_within_the_limits_is_one_segment() -> None:
    buf = _buffer(durable=None)
    _push(buf, _raw(list(range(10))))
    pending = buf.take(RawLaneConfig(roll_rows=10), 0.0)
    assert pending.rows == 10 and buf.empty
