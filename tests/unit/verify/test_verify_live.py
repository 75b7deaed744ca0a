"""``twg verify`` on lanes written here (no broker) and an Arrow IPC sink: what the
gateway itself produces, and what it does while verify reads, is never taken for a
fault — a retention floor just before skipped offsets, a segment rolled while a
partition is read, a flush landing after the lanes were read, a commit and a log end
read on either side of them."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import thalweg.verify.lanes as verify_lanes
import thalweg.verify.run as verify_run
from tests.helpers import ipc_sink_config, write_segment
from thalweg.cli.main import cli
from thalweg.config import load_config
from thalweg.kafka.offsets import PartitionOffsets
from thalweg.lane import LaneLayout
from thalweg.lane.layout import Lane
from thalweg.lane.upkeep.retention import raise_floor
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders
from thalweg.verify.lanes import LaneAudit
from thalweg.verify.report import PartitionSummary, Report


def configured(tmp_path: Path) -> tuple[Path, Path]:
    """A lane directory and a configuration with an Arrow IPC sink ``files`` on it."""
    lane = tmp_path / "lane"
    return lane, ipc_sink_config(tmp_path, lane)


def recover(config: Path) -> None:
    """One pass of the sink's feeder: it lands what the lane holds, as a running one
    would (called here, not through the CLI: it runs inside verify's CLI call too)."""
    cfg = load_config(config)
    [feeder] = build_feeders(cfg, LaneLayout(cfg.gateway.data_dir), MetadataColumns(), only="files")

    async def one_pass() -> None:
        await feeder.open()
        try:
            await feeder.pass_once(final=True)
        finally:
            await feeder.close()

    asyncio.run(one_pass())


def verify(config: Path) -> tuple[int, dict[str, Any]]:
    args = ["--output", "json", "verify", "-c", str(config), "--no-broker"]
    done = CliRunner().invoke(cli, args, obj={})
    return done.exit_code, json.loads(done.output)


def codes(report: dict[str, Any]) -> list[str]:
    return [f["code"] for f in report["findings"]]


def test_a_floor_just_before_skipped_offsets_leaves_the_sink_not_ahead(tmp_path: Path) -> None:
    # 0-4, a transaction marker at 5 (the next segment covers from it), 6-9, 10-12.
    lane, config = configured(tmp_path)
    write_segment(lane, "t", 0, range(5), 0)
    write_segment(lane, "t", 0, range(6, 10), 5)
    write_segment(lane, "t", 0, range(10, 13), 10)
    recover(config)
    code, report = verify(config)
    assert code == 0 and codes(report) == [], report["findings"]
    # Retention removes 0-4: its floor is that segment's end, 5 — the marker's position,
    # which the sink covers and the next segment's footer holds.
    raise_floor(LaneLayout(lane), "t", 0, 5, time.time())
    code, report = verify(config)
    assert code == 0 and codes(report) == [], report["findings"]
    assert report["partitions"][0]["lane"] == [[5, 13]]


def test_a_segment_rolled_while_a_partition_is_read_is_no_orphan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lane, config = configured(tmp_path)
    write_segment(lane, "t", 0, range(5), 0)
    recover(config)
    read_twins = verify_lanes._twins

    def twins_while_rolling(*args: Any, **kwargs: Any) -> Any:
        out = read_twins(*args, **kwargs)
        write_segment(lane, "t", 0, range(5, 10), 5)  # the gateway's next roll
        return out

    monkeypatch.setattr(verify_lanes, "_twins", twins_while_rolling)
    code, report = verify(config)
    assert code == 0 and codes(report) == [], report["findings"]
    # A twin whose raw file never came is one, once it has had time to be joined.
    monkeypatch.undo()
    decoded = LaneLayout(lane).partition_dir(Lane.DECODED, "t", 0)
    (
        LaneLayout(lane).partition_dir(Lane.RAW, "t", 0)
        / "00000000000000000005-00000000000000000009.parquet"
    ).unlink()
    young = decoded / "00000000000000000005-00000000000000000009.parquet"
    assert "orphan" not in codes(verify(config)[1])  # a write in flight, for a minute
    os.utime(young, (time.time() - 120, time.time() - 120))
    code, report = verify(config)
    assert code == 1 and "orphan" in codes(report), report["findings"]


def test_a_flush_landing_after_the_lanes_were_read_is_not_ahead_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lane, config = configured(tmp_path)
    write_segment(lane, "t", 0, range(5), 0)
    recover(config)
    audit_sink = verify_run.audit_sink

    def audit_after_a_flush(*args: Any, **kwargs: Any) -> None:
        # The gateway rolls a segment and its feeder lands it, after the lanes were read.
        write_segment(lane, "t", 0, range(5, 10), 5)
        recover(config)
        audit_sink(*args, **kwargs)

    monkeypatch.setattr(verify_run, "audit_sink", audit_after_a_flush)
    code, report = verify(config)
    assert code == 0 and codes(report) == [], report["findings"]
    assert report["sinks"]["files"]["records_checked"] == 5  # as read, before the flush


def test_the_commit_is_judged_as_read_before_the_lane_and_the_log_as_read_after() -> None:
    """Beside a running gateway the lane grows while it is read: the group's commit,
    read before it, can only trail it; the log's end, read after it, can only lead it.
    Here the lane was read at 15 while the gateway moved from commit 10 / log end 12 to
    commit 20 / log end 22 — nothing is wrong, and nothing is named."""
    lane = LaneAudit("t", 0, 0, 0, [(0, 15)], 15, np.arange(15), np.arange(15), True)
    summaries = {("t", 0): PartitionSummary("t", 0, 0, [(0, 15)], 15)}
    before = {("t", 0): PartitionOffsets(0, 12, 10)}
    after = {("t", 0): PartitionOffsets(0, 22, 20)}
    report = Report()
    verify_run._check_broker(["t"], before, after, {("t", 0): lane}, summaries, report)
    assert report.findings == []
    assert (summaries[("t", 0)].committed, summaries[("t", 0)].log_end) == (10, 22)
    # Read the other way round, the same moments are two faults: both are still named.
    verify_run._check_broker(["t"], after, before, {("t", 0): lane}, summaries, report)
    assert sorted(f.code for f in report.findings) == ["commit_ahead", "lane_ahead_of_log"]
