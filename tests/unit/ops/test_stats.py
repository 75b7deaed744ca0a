"""The /stats window: rates, latency percentiles, and naming a stalled stage."""

from __future__ import annotations

import time

from thalweg.ops.stats import PipelineStats


def test_rates_and_percentiles_over_the_window() -> None:
    s = PipelineStats(window_s=30, stall_after_s=10)
    for i in range(100):
        s.done("decode", 1000, 50_000, 0.001 * (i + 1))
    snap = s.snapshot()["stages"]["decode"]
    assert snap["records_per_s"] == 100_000  # 100k records over the 1 s floor
    assert 49 <= snap["p50_ms"] <= 51
    assert 98 <= snap["p99_ms"] <= 100
    assert s.snapshot()["stalled"] == []


def test_a_stage_with_work_waiting_and_nothing_done_is_stalled() -> None:
    s = PipelineStats(window_s=30, stall_after_s=0.2)
    s.done("write", 10, 100, 0.01)
    s.queued("write", 5000)
    s.queued("commit", 0)
    assert s.snapshot()["stalled"] == []
    time.sleep(0.3)
    assert s.snapshot()["stalled"] == ["write"]
    s.done("write", 5000, 1, 0.5)
    s.queued("write", 0)
    assert s.snapshot()["stalled"] == []


def test_old_events_leave_the_window() -> None:
    s = PipelineStats(window_s=0.1)
    s.done("fetch", 10, 10, 0.0)
    time.sleep(0.15)
    assert s.snapshot()["stages"]["fetch"]["records_per_s"] == 0
