"""Ownership edges: a revoke lets go of every partition it names, even when one
partition's flush fails; the fence's clock starts when the fence runs.

Soak, session 26: a segment conflict on one revoked partition stopped the revoke, the
partitions after it stayed buffered, and a second later one of them landed a segment
beside its new owner's. Now the rest are dropped (their records are read again by the
new owner), ownership is doubted so nothing in flight lands, and the failure still
stops the source.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow as pa
import pytest

from tests.unit.engine.test_checkpoint import COLS, R, setup
from thalweg.engine.ingest.buffer import PartitionBuffer
from thalweg.engine.ingest.fence import OwnershipFence
from thalweg.engine.ingest.partitions import Partitions
from thalweg.errors import SegmentConflictError
from thalweg.lane.coverage import scan_coverage
from thalweg.records import build_raw_batch


class NoDecoders:
    """The topic is not decoded (a raw-only source)."""

    def for_topic(self, topic: str) -> None:
        return None


def raw(partition: int, offsets: list[int]) -> pa.RecordBatch:
    recs = [R("t", partition, o, 0, 0, None, b"{}", ()) for o in offsets]
    return build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=COLS)


def test_a_failed_flush_in_a_revoke_drops_the_rest_and_fences_the_member(
    tmp_path: Path,
) -> None:
    fence = OwnershipFence(60, lambda: (True, None))
    cp, state, commits, conflicting = setup(tmp_path, fence)
    state.ctx.health.register(state.component, "source", gates_readiness=False)
    # Partition 0 conflicts with a segment another writer left; partition 1 is fine.
    state.ctx.writer.write("t", 0, pa.Table.from_batches([raw(0, [0, 1, 2])]), None, 0, 3)
    conflicting.add(raw(0, [1, 2]))
    other = PartitionBuffer.create(
        "t", 1, durable=None, committed=None, columns=COLS, decoded=False
    )
    other.add(raw(1, [0, 1, 2]))
    state.parts[("t", 1)] = other
    parts = Partitions(state, cp, NoDecoders())  # type: ignore[arg-type]

    with pytest.raises(SegmentConflictError):
        asyncio.run(parts.revoked([("t", 0), ("t", 1)]))

    assert state.parts == {}, "every revoked partition is let go"
    assert fence.in_doubt
    assert isinstance(state.fatal, SegmentConflictError)
    asyncio.run(cp.drain())  # a stop after it writes nothing more
    assert scan_coverage(state.ctx.layout, "t", 1).end is None, "partition 1 never written"
    assert commits.calls == []


def test_the_fence_clock_starts_when_the_fence_runs_not_when_it_is_made() -> None:
    """A long wait for the group's first assignment comes before the fence runs; it is
    not an event loop paused past the session."""
    fence = OwnershipFence(0.2, lambda: (True, None))
    time.sleep(0.3)  # the source's start: the group forming, longer than the limit

    async def tick_twice() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(fence.run(stop))
        await asyncio.sleep(0.25)
        stop.set()
        await task

    asyncio.run(tick_twice())
    assert not fence.in_doubt
