"""The feeder over a lane written here: skipped offsets wider than a replay window are
covered (not waited on forever), decoded rows get the raw lane's metadata columns by
position (a dead-lettered record in between), and a second pass writes nothing."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.helpers import feeder_pass
from thalweg.config import parse_config
from thalweg.lane.epochs import Divergence, close_epoch, mark_diverged
from thalweg.lane.layout import META_COVERS_FROM, Lane, LaneLayout, segment_name
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders

TS = pa.timestamp("ms", tz="UTC")
SOURCE = {"name": "s", "kind": "kafka", "bootstrap_servers": "127.0.0.1:1", "topics": ["t"]}


def write_segment(
    layout: LaneLayout, positions: list[int], decoded: list[int], covers_from: int
) -> None:
    name = segment_name(positions[0], positions[-1])
    raw = pa.table(
        {
            "_twg_position": pa.array(positions, pa.int64()),
            "_twg_source_timestamp": pa.array([1_000 * p for p in positions], TS),
            "_twg_source_key": pa.array([f"k{p}".encode() for p in positions]),
        }
    ).replace_schema_metadata({META_COVERS_FROM: str(covers_from).encode()})
    # As the decoded lane is: a row per record, a failed one with a null payload and
    # its error set (it is in the dead-letter lane).
    dec = pa.table(
        {
            "n": pa.array([p if p in decoded else None for p in positions], pa.int64()),
            "_twg_position": pa.array(positions, pa.int64()),
            "_twg_decode_error": pa.array(
                [None if p in decoded else "syntax: not JSON" for p in positions], pa.string()
            ),
        }
    )
    for lane, table in ((Lane.RAW, raw), (Lane.DECODED, dec)):
        d = layout.partition_dir(lane, "t", 0)
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, d / name)


def test_a_gap_wider_than_the_window_is_covered_and_metadata_is_matched(tmp_path: Path) -> None:
    layout = LaneLayout(tmp_path)
    # Positions 0..9 (record 4 dead-lettered: no decoded row), then 10..999 skipped
    # (compacted away: the next segment covers from 10), then 1000..1004.
    write_segment(layout, list(range(10)), [0, 1, 2, 3, 5, 6, 7, 8, 9], covers_from=0)
    write_segment(layout, list(range(1000, 1005)), list(range(1000, 1005)), covers_from=10)
    cfg = parse_config(
        {
            "gateway": {"data_dir": str(tmp_path)},
            "sources": [
                {"name": "s", "kind": "kafka", "bootstrap_servers": "127.0.0.1:1", "topics": ["t"]}
            ],
            "sinks": [{"name": "files", "kind": "arrow_ipc", "topics": ["t"]}],
            "recovery": {"window_records": 100},
        }
    )

    async def one_pass() -> tuple[int, int, int]:
        [f] = build_feeders(cfg, layout, MetadataColumns("_twg_"))
        try:
            await f.open()
            s = await f.pass_once(final=True)
            return s.rows, s.positions, s.lag_after
        finally:
            await f.close()

    assert asyncio.run(one_pass()) == (14, 1005, 0)
    assert asyncio.run(one_pass()) == (0, 0, 0)
    files = sorted((tmp_path / "sinks" / "files").rglob("*.arrow"))
    table = pa.concat_tables(
        [pa.ipc.open_file(pa.memory_map(str(f))).read_all() for f in files],
        promote_options="permissive",
    ).sort_by("_twg_position")
    positions = table.column("_twg_position").to_pylist()
    assert positions == [0, 1, 2, 3, 5, 6, 7, 8, 9, 1000, 1001, 1002, 1003, 1004]
    assert table.column("_twg_source_key").to_pylist() == [f"k{p}".encode() for p in positions]
    assert table.column("n").to_pylist() == positions
    assert "_twg_decode_error" not in table.column_names
    stamps = table.column("_twg_source_timestamp").cast(pa.int64()).to_pylist()
    assert stamps == [1_000 * p for p in positions]


def test_commit_rows_and_commit_bytes_commit_before_the_interval(tmp_path: Path) -> None:
    """A long ``commit_interval_s`` alone commits once, at the end of the pass; with
    ``commit_rows`` or ``commit_bytes`` a commit lands whenever that much waits."""
    layout = LaneLayout(tmp_path)
    for i in range(10):
        positions = list(range(10 * i, 10 * i + 10))
        write_segment(layout, positions, positions, covers_from=10 * i)

    def flushes(**sink: object) -> int:
        cfg = parse_config(
            {
                "gateway": {"data_dir": str(tmp_path)},
                "sources": [
                    {
                        "name": "s",
                        "kind": "kafka",
                        "bootstrap_servers": "127.0.0.1:1",
                        "topics": ["t"],
                    }
                ],
                "sinks": [
                    {"name": "f", "kind": "arrow_ipc", "topics": ["t"], "commit_interval_s": 3600}
                    | sink
                ],
                "recovery": {"window_records": 10},
            }
        )

        for written in (tmp_path / "sinks" / "f", tmp_path / "coverage"):  # a fresh sink
            shutil.rmtree(written, ignore_errors=True)
        return int(feeder_pass(cfg, "f").flushes)

    assert flushes() == 1
    assert flushes(commit_rows=25) == 4  # 30, 30, 30 rows, then the last 10
    row_bytes = pa.table({"n": pa.array([1], pa.int64())}).nbytes
    assert flushes(commit_bytes=row_bytes) == 10  # every window


def test_a_flush_never_holds_two_epochs_of_one_partition(tmp_path: Path) -> None:
    """Rows of epoch 0 wait unflushed when the partition's epoch closes and epoch 1
    starts over the same positions: they are flushed before epoch 1's rows are written,
    so a routed sink's replay can tell the epochs' rows apart by position."""
    layout = LaneLayout(tmp_path)
    write_segment(layout, list(range(10)), list(range(10)), covers_from=0)
    cfg = parse_config(
        {
            "gateway": {"data_dir": str(tmp_path)},
            "sources": [SOURCE],
            "sinks": [
                {"name": "f", "kind": "arrow_ipc", "topics": ["t"], "commit_interval_s": 3600}
            ],
        }
    )

    async def run() -> tuple[int, int]:
        [f] = build_feeders(cfg, layout, MetadataColumns("_twg_"))
        try:
            await f.open()
            first = await f.pass_once()  # written, not due: epoch 0's rows wait
            assert first.rows == 10 and first.flushes == 0
            reason = "offset_went_back"
            mark_diverged(layout, Divergence("t", 0, 0, reason, 10, 0, 10, "test"))
            assert close_epoch(layout, "t", 0) == 1
            write_segment(layout, list(range(5, 15)), list(range(5, 15)), covers_from=5)
            second = await f.pass_once(final=True)
            return second.rows, second.flushes
        finally:
            await f.close()

    # Epoch 0's rows went in a flush of their own before epoch 1's were written.
    assert asyncio.run(run()) == (10, 2)
    names = sorted(p.name for p in (tmp_path / "sinks" / "f").rglob("*.arrow"))
    assert [n[:7] for n in names] == ["e000000", "e000001"]
