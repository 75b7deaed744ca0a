"""What keeps two records from one offset: segments never overwritten or written beside
an overlap, overlaps from older lanes repaired or refused, the ownership fence, epochs
that close crash-safely, epoch record ids that never collide, continuity checks."""

from __future__ import annotations

import os
import time
from collections import namedtuple
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thalweg.config.models import RawLaneConfig
from thalweg.engine.ingest.continuity import LastRecord, check_record, check_start, last_record
from thalweg.engine.ingest.fence import OwnershipFence
from thalweg.errors import LaneError, OwnershipLostError, SegmentConflictError
from thalweg.lane import Lane, LaneLayout, SegmentWriter
from thalweg.lane.coverage import QUARANTINE, repair
from thalweg.lane.epochs import (
    CLOSED,
    DIVERGED,
    Divergence,
    close_epoch,
    closed_epochs,
    current_epoch,
    epoch_layout,
    mark_diverged,
    read_divergence,
)
from thalweg.ops.stats import PipelineStats
from thalweg.records import MetadataColumns, build_raw_batch
from thalweg.records.record_id import record_ids, with_epoch_ids

COLS = MetadataColumns()
R = namedtuple("R", "topic partition offset timestamp timestamp_type key value headers")


def raw(offsets: list[int], value: bytes = b"{}") -> pa.Table:
    recs = [R("t", 0, o, 1000 + o, 0, b"k", value, ()) for o in offsets]
    return pa.Table.from_batches([build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=COLS)])


def writer(tmp_path: Path) -> tuple[LaneLayout, SegmentWriter]:
    layout = LaneLayout(tmp_path)
    return layout, SegmentWriter(layout, COLS, RawLaneConfig())


# -- never overwritten, never beside an overlap ----------------------------------------


def test_a_raw_segment_is_never_overwritten(tmp_path: Path) -> None:
    _, w = writer(tmp_path)
    first = w.write("t", 0, raw([0, 1, 2], b'{"a":1}'), None, 0, 3)
    before = first.segment.path.read_bytes()
    with pytest.raises(SegmentConflictError, match="already holds offsets 0-2"):
        w.write("t", 0, raw([0, 1, 2], b'{"a":2}'), None, 0, 3)
    assert first.segment.path.read_bytes() == before
    assert not [p for p in first.segment.path.parent.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize(("offsets", "held"), [([2, 3, 4], "0-4"), ([4, 5], "0-4"), ([0], "0-4")])
def test_a_raw_segment_is_never_written_beside_an_overlap(
    tmp_path: Path, offsets: list[int], held: str
) -> None:
    _, w = writer(tmp_path)
    w.write("t", 0, raw([0, 1, 2, 3, 4]), None, 0, 5)
    with pytest.raises(SegmentConflictError, match=f"holds offsets {held}"):
        w.write("t", 0, raw(offsets), None, offsets[0], offsets[-1] + 1)
    w.write("t", 0, raw([5, 6]), None, 5, 7)  # the next range is fine


def test_the_link_itself_refuses_an_existing_name(tmp_path: Path) -> None:
    """A second writer that checked the directory before the first renamed: the final
    link() still refuses (the check alone would be a race)."""
    layout, w = writer(tmp_path)
    target = layout.partition_dir(Lane.RAW, "t", 0)
    target.mkdir(parents=True)
    w._check_free = lambda *a: None  # type: ignore[method-assign]  # lose the race
    w.write("t", 0, raw([0, 1]), None, 0, 2)
    with pytest.raises(SegmentConflictError, match="never overwritten"):
        w.write("t", 0, raw([0, 1], b'{"b":1}'), None, 0, 2)


def test_the_fence_stops_every_rename(tmp_path: Path) -> None:
    layout, w = writer(tmp_path)
    calls = []

    def fence() -> None:
        calls.append(1)
        raise OwnershipLostError("not written: in doubt")

    with pytest.raises(OwnershipLostError):
        w.write("t", 0, raw([0, 1]), raw([0, 1]), 0, 2, fence)
    assert calls
    for lane in Lane:
        d = layout.partition_dir(lane, "t", 0)
        assert not d.exists() or not list(d.iterdir()), f"{lane} has files"


def test_redecode_writes_only_the_decoded_twin(tmp_path: Path) -> None:
    layout, w = writer(tmp_path)
    seg = w.write("t", 0, raw([0, 1]), None, 0, 2).segment
    before = os.stat(seg.path).st_ino
    w.write_decoded("t", 0, seg, pa.table({"x": [1, 2]}))
    assert os.stat(seg.path).st_ino == before
    twin = layout.partition_dir(Lane.DECODED, "t", 0) / seg.path.name
    meta = pq.read_schema(twin).metadata
    assert meta[b"thalweg.lane"] == b"decoded" and meta[b"thalweg.covers_to"] == b"2"


# -- overlaps from older versions ------------------------------------------------------


def _plant(layout: LaneLayout, first: int, last: int) -> None:
    d = layout.partition_dir(Lane.RAW, "t", 0)
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(raw(list(range(first, last + 1))), d / f"{first:020d}-{last:020d}.parquet")


def test_a_contained_segment_is_quarantined_with_its_twins(tmp_path: Path) -> None:
    layout = LaneLayout(tmp_path)
    _plant(layout, 4000, 8132)
    _plant(layout, 4000, 4132)  # a zombie's segment from before fencing
    twin = layout.partition_dir(Lane.DECODED, "t", 0)
    twin.mkdir(parents=True)
    (twin / f"{4000:020d}-{4132:020d}.parquet").write_bytes(b"x")
    repair(layout, "t", 0)
    names = [(s.first, s.last) for s in layout.segments(Lane.RAW, "t", 0)]
    assert names == [(4000, 8132)]
    q = tmp_path / QUARANTINE
    assert (q / "raw/topic=t/partition=0" / f"{4000:020d}-{4132:020d}.parquet").exists()
    assert (q / "decoded/topic=t/partition=0" / f"{4000:020d}-{4132:020d}.parquet").exists()


def test_a_partial_overlap_is_refused_loudly(tmp_path: Path) -> None:
    layout = LaneLayout(tmp_path)
    _plant(layout, 0, 10)
    _plant(layout, 5, 20)
    with pytest.raises(SegmentConflictError, match="overlap without one containing"):
        repair(layout, "t", 0)
    assert len(layout.segments(Lane.RAW, "t", 0)) == 2  # nothing guessed, nothing moved


# -- epochs ----------------------------------------------------------------------------


def _divergence(epoch: int = 0) -> Divergence:
    return Divergence("t", 0, epoch, "log_end_below_lane", 300, 0, 100, "ends at 100", 1.0)


def test_an_epoch_closes_into_a_readable_lane_and_the_next_starts_empty(tmp_path: Path) -> None:
    layout, w = writer(tmp_path)
    w.write("t", 0, raw([0, 1, 2]), raw([0, 1, 2]), 0, 3)
    with pytest.raises(LaneError, match="has not diverged"):
        close_epoch(layout, "t", 0)
    mark_diverged(layout, _divergence())
    assert read_divergence(layout, "t", 0) == _divergence()
    assert current_epoch(layout, "t", 0) == 0
    assert close_epoch(layout, "t", 0) == 1
    assert current_epoch(layout, "t", 0) == 1
    assert closed_epochs(layout, "t", 0) == [0]
    assert layout.segments(Lane.RAW, "t", 0) == [] and layout.segments(Lane.DECODED, "t", 0) == []
    old = epoch_layout(layout, 0)
    assert [(s.first, s.last) for s in old.segments(Lane.RAW, "t", 0)] == [(0, 2)]
    assert [(s.first, s.last) for s in old.segments(Lane.DECODED, "t", 0)] == [(0, 2)]
    assert (old.partition_dir(Lane.RAW, "t", 0) / CLOSED).exists()
    # The new epoch's first segment may reuse the old names: they live apart.
    w.write("t", 0, raw([0, 1]), None, 0, 2)
    mark_diverged(layout, _divergence(epoch=1))
    assert close_epoch(layout, "t", 0) == 2
    assert closed_epochs(layout, "t", 0) == [0, 1]


def test_closing_an_epoch_resumes_after_a_crash_halfway(tmp_path: Path) -> None:
    layout, w = writer(tmp_path)
    w.write("t", 0, raw([0, 1]), raw([0, 1]), 0, 2)
    w.write("t", 0, raw([2, 3]), raw([2, 3]), 2, 4)
    mark_diverged(layout, _divergence())
    # The crash: the decoded lane and one raw file moved, the marker still in place.
    old = epoch_layout(layout, 0)
    for lane in (Lane.DECODED,):
        src, dst = layout.partition_dir(lane, "t", 0), old.partition_dir(lane, "t", 0)
        dst.mkdir(parents=True)
        for name in os.listdir(src):
            os.rename(src / name, dst / name)
    src, dst = layout.partition_dir(Lane.RAW, "t", 0), old.partition_dir(Lane.RAW, "t", 0)
    dst.mkdir(parents=True)
    first = sorted(n for n in os.listdir(src) if n.endswith(".parquet"))[0]
    os.rename(src / first, dst / first)
    assert current_epoch(layout, "t", 0) == 0  # the marker says so, whatever moved
    assert close_epoch(layout, "t", 0) == 1
    assert len(old.segments(Lane.RAW, "t", 0)) == 2 and len(old.segments(Lane.DECODED, "t", 0)) == 2
    assert not (src / DIVERGED).exists() and current_epoch(layout, "t", 0) == 1


def test_epoch_record_ids_never_collide_and_epoch_zero_keeps_its_ids() -> None:
    offsets = np.arange(100, dtype=np.int64)
    zero = record_ids("c", "t", 0, offsets).to_pylist()
    assert zero == record_ids("c", "t", 0, offsets, 0).to_pylist()
    one = record_ids("c", "t", 0, offsets, 1).to_pylist()
    two = record_ids("c", "t", 0, offsets, 2).to_pylist()
    assert not set(zero) & set(one) and not set(one) & set(two)
    batch = raw(list(range(100))).to_batches()[0]
    assert with_epoch_ids(batch, COLS, "c", "t", 0, 0) is batch
    stamped = with_epoch_ids(batch, COLS, "c", "t", 0, 1)
    assert stamped.column(COLS.record_id).to_pylist() == one
    assert stamped.column(COLS.value).equals(batch.column(COLS.value))


# -- continuity ------------------------------------------------------------------------


def test_the_log_start_check() -> None:
    assert check_start("t", 0, 0, None, 500) is None  # an empty lane continues anything
    assert check_start("t", 0, 0, 500, 500) is None
    assert check_start("t", 0, 0, 500, 0) is None
    div = check_start("t", 0, 3, 500, 501)
    assert div is not None and div.reason == "log_start_above_lane" and div.epoch == 3
    assert "500..500" in div.detail and div.broker_log_start == 501


def test_the_record_check_compares_key_value_and_timestamp(tmp_path: Path) -> None:
    layout, w = writer(tmp_path)
    w.write("t", 0, raw([0, 1, 2], b'{"v":1}'), None, 0, 3)
    last = last_record(layout, COLS, "t", 0, 3)
    assert last is not None and (last.offset, last.resume, last.value) == (2, 3, b'{"v":1}')
    same = raw([2, 3], b'{"v":1}').to_batches()[0]
    other = raw([2, 3], b'{"v":2}').to_batches()[0]
    later = raw([3, 4], b'{"v":2}').to_batches()[0]
    assert check_record(last, same, COLS)
    assert not check_record(last, other, COLS)
    assert check_record(last, later, COLS)  # the offset is not there: cannot tell
    moved = LastRecord(2, 3, b"k", b'{"v":1}', last.timestamp + timedelta(milliseconds=1))
    assert not check_record(moved, same, COLS)
    assert last_record(LaneLayout(tmp_path / "empty"), COLS, "t", 0, 0) is None


# -- the fence -------------------------------------------------------------------------


def test_the_fence_refuses_after_a_stall_and_clears_on_evidence() -> None:
    beats: list[float | None] = [None]
    fence = OwnershipFence(0.2, lambda: (True, beats[0]))
    fence.check()  # fresh: fine
    time.sleep(0.3)  # the loop did not tick: a writer thread must not rename
    with pytest.raises(OwnershipLostError, match="has not run for"):
        fence.check()
    assert fence.in_doubt
    assert not fence.try_clear()  # no heartbeat since
    beats[0] = time.monotonic()
    assert fence.try_clear() and not fence.in_doubt
    fence.doubt("a commit was refused")
    with pytest.raises(OwnershipLostError, match="commit was refused"):
        fence.check()
    fence.confirm("partitions assigned")
    fence.check()


def test_the_fence_limit_leaves_the_session_two_heartbeats() -> None:
    assert OwnershipFence.for_session(10_000, 3_000, lambda: (True, None)).stall_limit_s == 5.0
    assert OwnershipFence.for_session(30_000, 3_000, lambda: (True, None)).stall_limit_s == 24.0


# -- statistics never stop ingest ------------------------------------------------------


def test_stage_statistics_never_raise() -> None:
    got: list[int] = []

    def counter(stage: str, n: int) -> None:
        if n < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts")
        got.append(n)

    stats = PipelineStats(on_done=counter)
    stats.done("commit", -1500, 0, 0.01)  # a commit "backwards"
    stats.done("commit", 10, 0, 0.01)
    assert got == [0, 10]

    def broken(stage: str, n: int) -> None:
        raise RuntimeError("exporter down")

    PipelineStats(on_done=broken).done("write", 5, 5, 0.1)  # logged, not raised
