"""Compaction of a partition's small segments: runs of adjacent old small segments merge
into one file per lane (never the newest); the merged file keeps exact positions (name,
footer coverage) and every lane's rows in order; listings show it and not its parts at
once; the parts go only after the grace period; a crash that leaves both is repaired by
deleting the parts, not quarantining them."""

from __future__ import annotations

import errno
import itertools
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thalweg.config.models import RawLaneConfig
from thalweg.config.retention import CompactionConfig, RetentionConfig
from thalweg.lane.coverage import is_compacted, repair, scan_coverage
from thalweg.lane.layout import (
    META_COVERS_FROM,
    META_COVERS_TO,
    Lane,
    LaneLayout,
    Segment,
    segment_name,
)
from thalweg.lane.upkeep.compaction import files_per_partition, merge, plan_runs, sweep_merged
from thalweg.lane.upkeep.retention import decide, newest_at, raise_floor

T = "orders"
NOW = 1_000_000.0
CFG = CompactionConfig(enabled=True, target_bytes=1 << 30, min_files=4, min_age_s=60, grace_s=60)


def lane(tmp_path: Path, n: int = 10, rows: int = 50) -> LaneLayout:
    layout = LaneLayout(tmp_path)
    for i in range(n):
        first, last = i * rows, (i + 1) * rows - 1
        pos = pa.array(range(first, last + 1), pa.int64())
        meta = {META_COVERS_FROM: str(first).encode(), META_COVERS_TO: str(last + 1).encode()}
        raw = pa.table({"_twg_position": pos, "_twg_source_value": pa.array([b"v"] * rows)})
        dec = pa.table({"_twg_position": pos, "n": pa.array(range(first, last + 1))})
        for ln, table in ((Lane.RAW, raw), (Lane.DECODED, dec)):
            d = layout.partition_dir(ln, T, 0)
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(table.replace_schema_metadata(meta), d / segment_name(first, last))
            os.utime(d / segment_name(first, last), (NOW - 3600 + i,) * 2)
        if i % 3 == 0:  # some segments had dead letters, and a node refused records of them
            for d in (
                layout.partition_dir(Lane.DLQ, T, 0),
                tmp_path / "nodes" / "clean" / "dlq" / f"topic={T}" / "partition=0",
            ):
                d.mkdir(parents=True, exist_ok=True)
                pq.write_table(raw.slice(0, 1), d / segment_name(first, last))
    return layout


def rows(layout: LaneLayout, ln: Lane) -> list[int]:
    out: list[int] = []
    for s in layout.segments(ln, T, 0):
        out += pq.read_table(s.path).column("_twg_position").to_pylist()
    return out


def test_old_small_segments_merge_into_one_file_per_lane_with_exact_positions(
    tmp_path: Path,
) -> None:
    layout = lane(tmp_path)
    before = {ln: rows(layout, ln) for ln in Lane}
    (run,) = plan_runs(layout, T, 0, CFG, NOW)
    assert [s.first for s in run] == [i * 50 for i in range(9)]  # never the newest
    done = merge(layout, T, 0, run, RawLaneConfig())
    assert done is not None and done.parts == 9
    assert done.path.name == segment_name(0, 449)
    raw = layout.segments(Lane.RAW, T, 0)
    assert [s.path.name for s in raw] == [segment_name(0, 449), segment_name(450, 499)]
    assert is_compacted(raw[0]) and not is_compacted(raw[1])
    meta = pq.read_schema(raw[0].path).metadata
    assert meta[META_COVERS_FROM] == b"0" and meta[META_COVERS_TO] == b"450"
    assert scan_coverage(layout, T, 0).ranges == [(0, 500)]
    for ln in Lane:  # every lane: the same rows, in order, none twice
        assert rows(layout, ln) == before[ln]
    node = tmp_path / "nodes" / "clean" / "dlq" / f"topic={T}" / "partition=0"
    assert pq.read_table(node / segment_name(0, 449)).num_rows == 3  # parts 0, 3, 6
    assert files_per_partition(layout, T, 0) == 11  # the parts wait for the grace
    merged_at = raw[0].path.stat().st_mtime
    assert sweep_merged(layout, T, 0, grace_s=60, now=merged_at + 30) == 0
    removed = sweep_merged(layout, T, 0, grace_s=60, now=merged_at + 61)
    assert removed == 9 + 9 + 3 + 3  # raw and decoded parts, dead letters, node dead letters
    assert files_per_partition(layout, T, 0) == 2
    assert sorted(os.listdir(node)) == [segment_name(0, 449), segment_name(450, 499)]
    for ln in Lane:
        assert rows(layout, ln) == before[ln]


def test_runs_respect_age_size_adjacency_and_length(tmp_path: Path) -> None:
    layout = lane(tmp_path)
    assert plan_runs(layout, T, 0, CFG, NOW - 3600 + 2 + 60) == []  # only 3 are old enough
    small = CompactionConfig(enabled=True, target_bytes=1, min_files=2, min_age_s=0)
    assert plan_runs(layout, T, 0, small, NOW) == []  # every segment is already "large"
    one = sum(f.stat().st_size for f in layout.partition_dir(Lane.RAW, T, 0).iterdir())
    sized = CompactionConfig(enabled=True, target_bytes=one // 2, min_files=2, min_age_s=0)
    runs = plan_runs(layout, T, 0, sized, NOW)
    assert len(runs) >= 2 and all(len(r) >= 2 for r in runs)  # split by the size ceiling
    # A hole in the positions (not skipped offsets) ends a run.
    gap = layout.partition_dir(Lane.RAW, T, 0) / segment_name(200, 249)
    gap.unlink()
    (layout.partition_dir(Lane.DECODED, T, 0) / segment_name(200, 249)).unlink()
    runs = plan_runs(layout, T, 0, CFG, NOW)
    assert [[s.first for s in r] for r in runs] == [[0, 50, 100, 150], [250, 300, 350, 400]]


def test_segments_that_overlap_are_never_merged_into_one_file(tmp_path: Path) -> None:
    """Merged, a partial overlap would hold rows twice inside one file, where start-up's
    overlap check no longer sees it: a run never spans one, and merge refuses one."""
    layout = lane(tmp_path, n=6)  # 0-49 ... 250-299
    for first in (275, 325, 375, 425):  # 275-324 overlaps 250-299
        last = first + 49
        pos = pa.array(range(first, last + 1), pa.int64())
        meta = {META_COVERS_FROM: str(first).encode(), META_COVERS_TO: str(last + 1).encode()}
        for ln in (Lane.RAW, Lane.DECODED):
            d = layout.partition_dir(ln, T, 0)
            pq.write_table(
                pa.table({"_twg_position": pos}).replace_schema_metadata(meta),
                d / segment_name(first, last),
            )
            os.utime(d / segment_name(first, last), (NOW - 3600,) * 2)
    for run in plan_runs(layout, T, 0, CFG, NOW):
        assert all(b.first > a.last for a, b in itertools.pairwise(run)), run
    segments = {s.first: s for s in layout.segments(Lane.RAW, T, 0)}
    overlapping = [segments[200], segments[250], segments[275], segments[325]]
    assert merge(layout, T, 0, overlapping, RawLaneConfig()) is None
    assert not (layout.partition_dir(Lane.RAW, T, 0) / segment_name(200, 374)).exists()


def test_a_crash_after_the_merge_is_repaired_by_deleting_the_parts(tmp_path: Path) -> None:
    layout = lane(tmp_path)
    (run,) = plan_runs(layout, T, 0, CFG, NOW)
    merge(layout, T, 0, run, RawLaneConfig())
    repair(layout, T, 0)  # start-up: the parts are the merge's, not a second writer's
    assert files_per_partition(layout, T, 0) == 2
    assert not (tmp_path / "quarantine").exists()
    assert rows(layout, Lane.DECODED) == list(range(500))


def test_a_merge_the_disk_refuses_leaves_the_parts_and_no_twin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC at the raw file, after the dead letters, decoded and node twins were
    written: the merge raises, its twins are gone (they would hold space the ingest
    needs, and a directory read would see their rows twice), the parts are untouched,
    and the next run merges."""
    from thalweg.lane.upkeep import compaction

    layout = lane(tmp_path)
    before = {ln: rows(layout, ln) for ln in Lane}
    (run,) = plan_runs(layout, T, 0, CFG, NOW)
    name = segment_name(0, 449)
    real = compaction.write_file_durably

    def full_for_raw(path: Path, *args: object, **kwargs: object) -> None:
        if path.parent == layout.partition_dir(Lane.RAW, T, 0):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compaction, "write_file_durably", full_for_raw)
    with pytest.raises(OSError, match="No space left on device"):
        merge(layout, T, 0, run, RawLaneConfig())
    node = tmp_path / "nodes" / "clean" / "dlq" / f"topic={T}" / "partition=0"
    dirs = [layout.partition_dir(ln, T, 0) for ln in Lane] + [node]
    assert [d for d in dirs if (d / name).exists()] == []
    assert files_per_partition(layout, T, 0) == 10
    for ln in Lane:
        assert rows(layout, ln) == before[ln]
    monkeypatch.undo()
    assert merge(layout, T, 0, run, RawLaneConfig()) is not None
    assert all((d / name).exists() for d in dirs)


def test_a_crash_before_the_raw_file_leaves_no_node_dead_letters_twice(tmp_path: Path) -> None:
    """Killed after the nodes' dead letters were merged and before the raw file landed:
    start-up removes that merged file (the parts' own files still hold the refusals),
    and keeps the files named after raw segments."""
    layout = lane(tmp_path)
    node = tmp_path / "nodes" / "clean" / "dlq" / f"topic={T}" / "partition=0"
    parts = sorted(os.listdir(node))
    unlanded = node / segment_name(0, 449)
    pq.write_table(pq.read_table(node / parts[0]), unlanded)
    repair(layout, T, 0)
    assert not unlanded.exists()
    assert sorted(os.listdir(node)) == parts


class _Killed(BaseException):
    """The process died here."""


def _on_disk(directory: Path) -> list[int]:
    """Every position in every file of a directory (what a reader of it counts)."""
    out: list[int] = []
    for name in sorted(os.listdir(directory)):
        out += pq.read_table(directory / name).column("_twg_position").to_pylist()
    return sorted(out)


def test_a_sweep_killed_after_any_deletion_leaves_every_row_once_after_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parts of a merge are deleted one file at a time; a kill between any two
    deletions, then start-up repair, leaves each lane's directory (and the nodes' dead
    letters) holding every row once. A decoded part outliving its raw file lies inside
    the merged twin, where no listing shows it — found by a CI run of the compaction
    crash test (100 decoded rows twice)."""
    whole = lane(tmp_path / "whole")
    merge(whole, T, 0, run_of(whole), RawLaneConfig())
    assert sweep_merged(whole, T, 0, grace_s=0) == 9 + 9 + 3 + 3
    node_rel = Path("nodes") / "clean" / "dlq" / f"topic={T}" / "partition=0"
    expected = [_on_disk(whole.partition_dir(ln, T, 0)) for ln in Lane]
    expected.append(_on_disk(tmp_path / "whole" / node_rel))
    real = Path.unlink
    k = 0
    while True:  # killed at the k-th unlink (Arrow IPC copies first), until none is left
        root = tmp_path / f"killed-{k}"
        layout = lane(root)
        merge(layout, T, 0, run_of(layout), RawLaneConfig())
        calls = 0

        def dying(path: Path, missing_ok: bool = False, *, _k: int = k) -> None:
            nonlocal calls
            calls += 1
            if calls > _k:
                raise _Killed
            real(path, missing_ok)

        monkeypatch.setattr(Path, "unlink", dying)
        try:
            sweep_merged(layout, T, 0, grace_s=0)
            killed = False
        except _Killed:
            killed = True
        monkeypatch.undo()
        repair(layout, T, 0)
        dirs = [layout.partition_dir(ln, T, 0) for ln in Lane] + [root / node_rel]
        assert [_on_disk(d) for d in dirs] == expected, f"killed after {k} unlinks"
        assert not (root / "quarantine").exists()
        if not killed:
            break
        k += 1
    assert k == 9 * 5  # a try per part: its copy, decoded, dead letters, node dead letters, raw


def run_of(layout: LaneLayout) -> list[Segment]:
    (run,) = plan_runs(layout, T, 0, CFG, NOW)
    return run


def test_a_floor_that_rose_after_the_run_was_planned_keeps_the_merge_off(tmp_path: Path) -> None:
    """Retention raising the floor inside a run between planning and merging: merged,
    the records below the floor would come back (``earliest`` down, removed records
    served). The merge is skipped; the next pass merges what is above the floor."""
    layout = lane(tmp_path)
    (run,) = plan_runs(layout, T, 0, CFG, NOW)
    raise_floor(layout, T, 0, 150, NOW)  # inside the run: 0-449
    assert merge(layout, T, 0, run, RawLaneConfig()) is None
    raw = layout.segments(Lane.RAW, T, 0, retained=False, contained=True)
    assert not [s for s in raw if s.first < 150 <= s.last], "a file across the floor"
    (again,) = plan_runs(layout, T, 0, CFG, NOW)
    assert again[0].first == 150
    done = merge(layout, T, 0, again, RawLaneConfig())
    assert done is not None and done.path.name == segment_name(150, 449)
    assert scan_coverage(layout, T, 0).ranges[0][0] == 150


def test_a_merged_file_is_as_old_as_its_newest_record_for_retention(tmp_path: Path) -> None:
    """A merged file is written now, but its records are as old as its parts: retention
    by age removes it once its newest record is old enough (with its file time it never
    did, and a merge absorbing new segments kept the floor down for ever)."""
    layout = lane(tmp_path)  # parts written an hour ago
    (run,) = plan_runs(layout, T, 0, CFG, NOW)
    done = merge(layout, T, 0, run, RawLaneConfig())
    assert done is not None
    assert time.time() - done.path.stat().st_mtime < 60  # the file itself is new
    merged = next(s for s in layout.segments(Lane.RAW, T, 0) if s.first == 0)
    assert newest_at(merged) == max(NOW - 3600 + i for i in range(9))
    age = RetentionConfig(max_age_s=1800, grace_s=0)
    assert decide(layout, T, 0, age, now=NOW).floor == 450  # the merge goes, not the newest


def test_under_retention_by_age_a_run_spans_at_most_the_given_time(tmp_path: Path) -> None:
    layout = lane(tmp_path, n=10)  # parts' times a second apart
    runs = plan_runs(layout, T, 0, CFG, NOW, span_s=3.5)
    assert [[s.first for s in r] for r in runs] == [[0, 50, 100, 150], [200, 250, 300, 350]]
    for run in runs:
        assert newest_at(run[-1]) - newest_at(run[0]) <= 3.5
