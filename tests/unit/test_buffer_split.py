"""A take is at most a segment's worth: what one fetch brought beyond the roll limits
is written as further segments, in order, each covering up to where the next begins."""

from __future__ import annotations

import json
from collections import namedtuple
from itertools import pairwise

import pyarrow as pa

from thalweg.codecs.base import DecodeReason
from thalweg.codecs.json import JsonArrowDecoder
from thalweg.config.models import RawLaneConfig
from thalweg.engine.buffer import PartitionBuffer
from thalweg.records import MetadataColumns, build_raw_batch

COLS = MetadataColumns()
R = namedtuple("R", "topic partition offset timestamp timestamp_type key value headers")


def _raw(offsets: list[int], bad: frozenset[int] = frozenset()) -> pa.RecordBatch:
    recs = [
        R("t", 0, o, 0, 0, None, b"{not json" if o in bad else json.dumps({"id": o}).encode(), ())
        for o in offsets
    ]
    return build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=COLS)


def _buffer(durable: int | None) -> PartitionBuffer:
    return PartitionBuffer.create(
        "t", 0, durable=durable, committed=durable, columns=COLS, decoder=JsonArrowDecoder(COLS)
    )


def test_a_fetch_larger_than_a_segment_is_written_as_several() -> None:
    # Offsets 100..199 with gaps (a compacted topic), resumed at 90: the first segment
    # covers from 90, and the pieces cover 90..end with no hole and no overlap.
    offsets = [o for o in range(100, 260) if o % 3]
    buf = _buffer(durable=90)
    buf.sink.push(_raw(offsets, bad=frozenset({101, 190})))
    roll = RawLaneConfig(roll_rows=30)
    assert buf.due(0.0, roll)
    held = buf.held_bytes
    pieces = []
    while not buf.empty:
        pieces.append(buf.take(roll))
        assert buf.held_bytes == held  # taken, still held until written
    assert [p.raw.num_rows for p in pieces] == [27, 27, 27, 26]
    assert sum(p.nbytes for p in pieces) == held
    assert pieces[0].span.covers_from == 90
    assert pieces[-1].span.covers_to == offsets[-1] + 1
    for before, after in pairwise(pieces):
        assert after.span.covers_from == before.span.covers_to
        assert after.span.first > before.span.last
    for p in pieces:
        got = p.raw.column(COLS.position).to_pylist()
        assert (p.span.first, p.span.last, p.span.records) == (got[0], got[-1], len(got))
        assert p.span.covers_from <= p.span.first and p.span.last < p.span.covers_to
        assert p.decoded is not None and p.decoded.num_rows == p.raw.num_rows
    assert [o for p in pieces for o in p.raw.column(COLS.position).to_pylist()] == offsets
    # A failed row's index is its row in its own piece's decoded table.
    failed = [
        (p.raw.column(COLS.position)[f.row].as_py(), f.reason) for p in pieces for f in p.failures
    ]
    assert [o for o, _ in failed] == [101, 190]
    assert all(r is DecodeReason.SYNTAX for _, r in failed)


def test_pieces_are_written_before_anything_fetched_after_them() -> None:
    buf = _buffer(durable=None)
    buf.sink.push(_raw(list(range(0, 50))))
    roll = RawLaneConfig(roll_rows=20)
    first = buf.take(roll)
    buf.sink.push(_raw(list(range(50, 55))))
    assert buf.held_rows == 55
    rest = [buf.take(roll), buf.take(roll)]
    assert [p.span.first for p in [first, *rest]] == [0, 17, 34]
    assert buf.take(roll).span.first == 50  # then the newer records, once due


def test_the_byte_limit_cuts_too() -> None:
    buf = _buffer(durable=None)
    batch = _raw(list(range(1000)))
    buf.sink.push(batch)
    roll = RawLaneConfig(roll_bytes=batch.nbytes // 4 + 1)
    sizes = []
    while not buf.empty:
        sizes.append(buf.take(roll).raw.num_rows)
    assert sizes == [250, 250, 250, 250]


def test_a_take_within_the_limits_is_one_segment() -> None:
    buf = _buffer(durable=None)
    buf.sink.push(_raw(list(range(10))))
    pending = buf.take(RawLaneConfig(roll_rows=10))
    assert pending.raw.num_rows == 10 and buf.empty
