"""The commit protocol on a real lane: buffered records → durable segment → commit of
exactly its end — never beyond what is durable, never backwards, never for a held
partition or while ownership is in doubt; a lane that cannot be written is retried
until it can, a conflicting segment stops the source, a fenced write writes nothing.

The source side is a recorder of commits: the protocol only ever calls ``commit``, and
the brokers' side of it is covered end to end (test_crash_exactness, test_zombie_writer).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import namedtuple
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thalweg.codecs.json import JsonArrowDecoder
from thalweg.config.models import KafkaSourceConfig, RawLaneConfig
from thalweg.engine.context import LaneContext, SourceState
from thalweg.engine.ingest.buffer import PartitionBuffer
from thalweg.engine.ingest.checkpoint import WRITES_IN_FLIGHT, Checkpoint
from thalweg.engine.ingest.fence import OwnershipFence
from thalweg.errors import SegmentConflictError
from thalweg.lane import Lane, LaneLayout, SegmentWriter
from thalweg.lane.epochs import Divergence
from thalweg.lane.read.live import LiveTail
from thalweg.ops.health import Health
from thalweg.ops.metrics import Metrics
from thalweg.pipeline.decode import decode_batch
from thalweg.records import MetadataColumns, build_raw_batch

COLS = MetadataColumns()
R = namedtuple("R", "topic partition offset timestamp timestamp_type key value headers")
KEY = ("t", 0)


class Commits:
    """Records what the protocol commits (the only source call it makes)."""

    def __init__(self) -> None:
        self.calls: list[dict[tuple[str, int], int]] = []

    async def commit(self, positions: dict[tuple[str, int], int]) -> None:
        self.calls.append(dict(positions))


def raw(offsets: list[int]) -> pa.RecordBatch:
    recs = [R("t", 0, o, 0, 0, None, b"{}", ()) for o in offsets]
    return build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=COLS)


def setup(
    tmp_path: Path, fence: OwnershipFence | None = None, roll: RawLaneConfig | None = None
) -> tuple[Checkpoint, SourceState, Commits, PartitionBuffer]:
    layout = LaneLayout(tmp_path)
    health = Health()
    health.register("raw_lane", "raw_lane", gates_readiness=True)
    ctx = LaneContext(
        layout=layout,
        writer=SegmentWriter(layout, COLS, RawLaneConfig()),
        columns=COLS,
        live=LiveTail(),
        metrics=Metrics(),
        health=health,
        raw_cfg=roll or RawLaneConfig(),
    )
    cfg = KafkaSourceConfig(name="s", bootstrap_servers="127.0.0.1:1", topics=["t"])
    commits = Commits()
    state = SourceState(cfg, ctx, commits, fence, "source:s")  # type: ignore[arg-type]
    buf = PartitionBuffer.create("t", 0, durable=None, committed=None, columns=COLS, decoded=False)
    state.parts[KEY] = buf
    return Checkpoint(state, None), state, commits, buf


def test_a_flush_makes_a_segment_durable_then_commits_exactly_its_end(tmp_path: Path) -> None:
    cp, state, commits, buf = setup(tmp_path)
    buf.add(raw([0, 1, 2]))
    asyncio.run(cp.flush_now(KEY))
    segs = state.ctx.layout.segments(Lane.RAW, "t", 0)
    assert [(s.first, s.last) for s in segs] == [(0, 2)]
    assert commits.calls == [{KEY: 3}]
    assert (buf.durable, buf.committed, buf.held_bytes, buf.held_rows) == (3, 3, 0, 0)
    asyncio.run(cp.flush_now(KEY))  # nothing new: no second segment, no second commit
    assert commits.calls == [{KEY: 3}]


def test_a_fetch_beyond_the_roll_limits_lands_as_segments_each_committed(
    tmp_path: Path,
) -> None:
    cp, state, commits, buf = setup(tmp_path, roll=RawLaneConfig(roll_rows=4))
    buf.add(raw(list(range(10))))
    asyncio.run(cp.flush_now(KEY))
    segs = state.ctx.layout.segments(Lane.RAW, "t", 0)
    assert [(s.first, s.last) for s in segs] == [(0, 3), (4, 7), (8, 9)]
    assert commits.calls == [{KEY: 4}, {KEY: 8}, {KEY: 10}]
    assert (buf.durable, buf.committed, buf.held_bytes, buf.held_rows) == (10, 10, 0, 0)


def test_nothing_is_committed_until_the_lane_can_be_written(tmp_path: Path) -> None:
    cp, state, commits, buf = setup(tmp_path)
    blocked = state.ctx.layout.partition_dir(Lane.RAW, "t", 0)
    blocked.parent.mkdir(parents=True)
    blocked.write_bytes(b"a file where the partition directory should be")
    buf.add(raw([0, 1]))
    seen: list[Any] = []

    def unblock() -> None:
        time.sleep(0.5)  # a few failed attempts, each retried
        seen.append(list(commits.calls))
        blocked.unlink()

    t = threading.Thread(target=unblock)
    t.start()
    asyncio.run(cp.flush_now(KEY))
    t.join()
    assert seen == [[]]  # nothing committed while the lane could not be written
    assert commits.calls == [{KEY: 2}]
    assert state.ctx.metrics.write_errors.labels("t")._value.get() >= 1


def test_never_committed_for_a_held_partition_in_doubt_or_backwards(tmp_path: Path) -> None:
    cp, state, commits, buf = setup(tmp_path)
    buf.durable = 10
    state.held[KEY] = Divergence("t", 0, 0, "offset_went_back", 10, None, 5, "x")
    asyncio.run(cp.commit(buf))
    del state.held[KEY]
    buf.committed = 20  # the group is ahead of the lane's end
    asyncio.run(cp.commit(buf))
    assert commits.calls == []

    fence = OwnershipFence(60, lambda: (True, None))
    cp, state, commits, buf = setup(tmp_path / "doubt", fence)
    buf.durable = 10
    fence.doubt("a test")
    asyncio.run(cp.commit(buf))
    assert commits.calls == []
    fence.confirm("a test")
    asyncio.run(cp.commit(buf))
    assert commits.calls == [{KEY: 10}]


def test_a_fenced_write_writes_and_commits_nothing_and_the_source_goes_on(
    tmp_path: Path,
) -> None:
    fence = OwnershipFence(60, lambda: (True, None))
    cp, state, commits, buf = setup(tmp_path, fence)
    buf.add(raw([0, 1]))
    fence.doubt("paused past the session")
    asyncio.run(cp.flush_now(KEY))
    assert state.ctx.layout.segments(Lane.RAW, "t", 0) == []
    assert commits.calls == [] and state.fatal is None
    # Refused, not lost: the segment is back in the buffer (the drop that follows, if
    # ownership was lost, counts it), and written once the doubt clears.
    assert buf.held_rows == 2 and buf.in_flight_rows == 0
    fence.confirm("paused past the session")
    asyncio.run(cp.flush_now(KEY))
    assert [(s.first, s.last) for s in state.ctx.layout.segments(Lane.RAW, "t", 0)] == [(0, 1)]
    assert commits.calls == [{KEY: 2}] and buf.held_rows == 0


def test_a_refused_segment_of_several_goes_back_first_and_none_is_skipped(
    tmp_path: Path,
) -> None:
    """Ownership in doubt after the first of three segments of one take landed: the
    others stay buffered, in order; once the doubt clears they land with no hole."""
    fence = OwnershipFence(60, lambda: (True, None))
    cp, state, commits, buf = setup(tmp_path, fence, roll=RawLaneConfig(roll_rows=4))
    buf.add(raw(list(range(10))))
    land = cp._land

    async def land_then_doubt(*a: Any) -> None:
        await land(*a)
        fence.doubt("a test")

    cp._land = land_then_doubt  # type: ignore[method-assign]
    asyncio.run(cp.flush_now(KEY))
    segs = state.ctx.layout.segments(Lane.RAW, "t", 0)
    assert [(s.first, s.last) for s in segs] == [(0, 3)]
    assert buf.held_rows == 6 and commits.calls == [{KEY: 4}]
    cp._land = land  # type: ignore[method-assign]
    fence.confirm("a test")
    asyncio.run(cp.flush_now(KEY))
    segs = state.ctx.layout.segments(Lane.RAW, "t", 0)
    assert [(s.first, s.last) for s in segs] == [(0, 3), (4, 7), (8, 9)]
    assert commits.calls == [{KEY: 4}, {KEY: 8}, {KEY: 10}] and buf.empty


def test_a_conflicting_segment_stops_the_source_loudly(tmp_path: Path) -> None:
    cp, state, commits, buf = setup(tmp_path)
    state.ctx.writer.write("t", 0, pa.Table.from_batches([raw([0, 1, 2])]), None, 0, 3)
    buf.add(raw([1, 2]))  # offsets another file already holds
    with pytest.raises(SegmentConflictError):
        asyncio.run(cp.flush_now(KEY))
    assert isinstance(state.fatal, SegmentConflictError)
    assert commits.calls == []
    asyncio.run(cp.drain())  # after a lost batch nothing more is written or committed
    assert commits.calls == []


def test_dead_letters_carry_the_decode_stage_reasons_across_batches(tmp_path: Path) -> None:
    """Failures keep their typed reason from the decode stage to the dead-letter lane,
    and their rows stay theirs when a segment holds several fetched batches."""
    cp, state, commits, _ = setup(tmp_path)
    buf = PartitionBuffer.create("t", 0, durable=None, committed=None, columns=COLS, decoded=True)
    decoder = JsonArrowDecoder(COLS)
    state.parts[KEY] = buf

    def batch(first: int, values: list[bytes]) -> pa.RecordBatch:
        recs = [R("t", 0, first + i, 0, 0, None, v, ()) for i, v in enumerate(values)]
        return build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=COLS)

    for fetched in (
        batch(0, [b'{"a": 1}', b'{"a": 2}', b"{broken"]),
        batch(3, [b'{"a": 4}', b"", b'{"a": 6}']),
    ):
        decoded, result = decode_batch(decoder, fetched, COLS)
        buf.add(fetched, decoded, result.failures)
    asyncio.run(cp.flush_now(KEY))
    dlq = state.ctx.layout.segments(Lane.DLQ, "t", 0)
    assert len(dlq) == 1
    dead = pq.read_table(dlq[0].path)
    assert dead.column(COLS.position).to_pylist() == [2, 4]
    assert dead.column("_twg_dlq_reason").to_pylist() == ["syntax", "empty"]
    assert dead.column("_twg_dlq_stage").to_pylist() == ["decode", "decode"]
    assert dead.column(COLS.value).to_pylist() == [b"{broken", b""]
    assert commits.calls == [{KEY: 6}]


def test_a_write_whose_buffer_was_dropped_while_it_waited_writes_nothing(
    tmp_path: Path,
) -> None:
    """A segment waits for a write slot; meanwhile ownership is doubted (its buffer is
    dropped and replaced, rewound to the durable end) and confirmed again. The waiting
    write must not land: the new buffer reads the same records again, and two writes of
    them would be a segment conflict that stops the source (found by ``make soak``)."""
    fence = OwnershipFence(60, lambda: (True, None))
    cp, state, commits, buf = setup(tmp_path, fence)
    buf.add(raw([0, 1]))

    async def run() -> None:
        for _ in range(WRITES_IN_FLIGHT):  # every slot taken by other partitions' writes
            await cp._writing.acquire()
        first = asyncio.create_task(cp.flush_now(KEY))
        await asyncio.sleep(0.05)  # it waits for a slot
        fence.doubt("a test")
        fresh = PartitionBuffer.create(
            "t", 0, durable=None, committed=None, columns=COLS, decoded=False
        )
        state.parts[KEY] = fresh  # the drop: rewound, the records to be read again
        fence.confirm("a test")
        for _ in range(WRITES_IN_FLIGHT):
            cp._writing.release()
        await first
        assert state.ctx.layout.segments(Lane.RAW, "t", 0) == []
        fresh.add(raw([0, 1]))  # read again from the durable end
        await cp.flush_now(KEY)

    asyncio.run(run())
    assert state.fatal is None
    assert [(s.first, s.last) for s in state.ctx.layout.segments(Lane.RAW, "t", 0)] == [(0, 1)]
    assert commits.calls == [{KEY: 2}]
