"""Retention of a partition's lanes: the oldest segments go first, by size or by age,
never the newest; never past what a sink has not landed; the floor rises first — the
layout hides what is below it at once — and the files (every lane, node lanes and node
dead letters included) go only after the grace period; a read below the floor is an
error naming the earliest position."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from thalweg.config.retention import RetentionConfig
from thalweg.lane.coverage import scan_coverage
from thalweg.lane.layout import Lane, LaneLayout, segment_name
from thalweg.lane.upkeep.retention import decide, raise_floor, sweep
from thalweg.sinks.arrow_ipc import file_name

T = "orders"


def lane(tmp_path: Path, n: int = 5, rows: int = 100) -> LaneLayout:
    """``n`` segments of ``rows`` positions in every lane, the oldest first (mtimes one
    hour apart), and a node lane and node dead letters beside them."""
    layout = LaneLayout(tmp_path)
    now = 1_000_000.0
    for i in range(n):
        first, last = i * rows, (i + 1) * rows - 1
        table = pa.table({"_twg_position": pa.array(range(first, last + 1), pa.int64())})
        for ln in Lane:
            d = layout.partition_dir(ln, T, 0)
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, d / segment_name(first, last))
            os.utime(d / segment_name(first, last), (now - (n - i) * 3600,) * 2)
        node = tmp_path / "nodes" / "clean" / f"topic={T}" / "partition=0"
        node.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, node / file_name(0, first, last + 1, ".parquet"))
        dead = tmp_path / "nodes" / "clean" / "dlq" / f"topic={T}" / "partition=0"
        dead.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, dead / segment_name(first, last))
    return layout


def sizes(layout: LaneLayout) -> int:
    return sum(
        (layout.partition_dir(ln, T, 0) / s.path.name).stat().st_size
        for s in layout.segments(Lane.RAW, T, 0)
        for ln in Lane
    )


def test_the_oldest_segments_go_by_size_and_by_age_never_the_newest(tmp_path: Path) -> None:
    layout = lane(tmp_path)
    one = sizes(layout) // 5
    assert decide(layout, T, 0, RetentionConfig(), now=1e6).floor is None  # no bounds
    by_size = decide(layout, T, 0, RetentionConfig(max_bytes=2 * one + 1), now=1e6)
    assert by_size.floor == 300  # three of five go, two fit
    by_age = decide(layout, T, 0, RetentionConfig(max_age_s=3.5 * 3600), now=1e6)
    assert by_age.floor == 200  # the segments 5 h and 4 h old
    everything = decide(layout, T, 0, RetentionConfig(max_bytes=1), now=1e6)
    assert everything.floor == 400  # all but the newest


def test_a_sink_that_has_not_landed_holds_retention_back(tmp_path: Path) -> None:
    layout = lane(tmp_path)
    held = decide(
        layout, T, 0, RetentionConfig(max_bytes=1), now=1e6, keep_from=250, held_by="sink lake"
    )
    assert held.floor == 200  # up to the last segment the sink has wholly landed
    assert held.held_by == f"sink lake has not landed {T}[0]@250"


def test_the_floor_hides_at_once_and_the_files_go_after_the_grace(tmp_path: Path) -> None:
    layout = lane(tmp_path)
    raise_floor(layout, T, 0, 200, now=1000.0)
    assert [s.first for s in layout.segments(Lane.RAW, T, 0)] == [200, 300, 400]
    assert [s.first for s in layout.segments(Lane.DLQ, T, 0)] == [200, 300, 400]
    assert scan_coverage(layout, T, 0).ranges == [(200, 500)]
    raw_dir = layout.partition_dir(Lane.RAW, T, 0)
    assert (raw_dir / segment_name(0, 99)).exists()  # a read planned before still has it
    assert sweep(layout, T, 0, grace_s=60, now=1030.0) == (0, 0)
    raise_floor(layout, T, 0, 100, now=1040.0)  # a floor never goes down
    assert layout.floor(T, 0) == 200
    files, nbytes = sweep(layout, T, 0, grace_s=60, now=1061.0)
    assert files == 2 * 3 + 2 * 2 and nbytes > 0  # 2 segments x 3 lanes, node lane + dead
    for ln in Lane:
        names = sorted(os.listdir(layout.partition_dir(ln, T, 0)))
        assert names == [segment_name(a, a + 99) for a in (200, 300, 400)]
    node = sorted(os.listdir(tmp_path / "nodes" / "clean" / f"topic={T}" / "partition=0"))
    assert len(node) == 3 and node[0] == file_name(0, 200, 300, ".parquet")
    assert sweep(layout, T, 0, grace_s=60, now=2000.0) == (0, 0)  # done once
