"""Retention under SIGKILL: ``twg stream`` killed again and again while records arrive
and retention raises each partition's floor and sweeps the files below it.

A kill can land between the two steps (the floor written durably; the files below it
deleted ``grace_s`` later) or inside a sweep, between one lane's deletions and the next.
The floor and its pending steps are on disk, so the next start sweeps what is due and
removes any twin left without its raw segment. At the end each partition's lanes hold
exactly the positions from its floor to its end, once, in the raw and decoded lanes
alike, counting every file on disk; the floor never rose past a position not yet
durable, and no temp file is left.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from confluent_kafka import Producer

from tests.e2e.test_compaction_crash import ranges, temp_files
from tests.e2e.test_crash_exactness import start_gateway, wait_started
from tests.helpers import committed_offsets, seeded_rng, wait_until
from thalweg.embedded import TansuBroker
from thalweg.lane import LaneLayout, scan_coverage

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 2
TOTAL = 16_000
KILLS = 5


def config_text(bootstrap: str, topic: str, group: str, data: Path) -> str:
    """100-row segments of ~25 KB, at most 150 KB per partition, swept 2 s after the
    floor rises: a kill finds floors raised and files not yet deleted."""
    return f"""
[gateway]
data_dir = "{data}"
flight_listen = "grpc://127.0.0.1:0"
http_listen = "127.0.0.1:0"
gc_tuning = false

[raw_lane]
roll_age_s = 0.25
roll_rows = 100

[retention]
max_bytes = 150000
grace_s = 2.0
interval_s = 0.2

[[sources]]
name = "retain"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "{group}"
session_timeout_ms = 2000
heartbeat_interval_ms = 500
max_poll_records = 100
"""


def produce(bootstrap: str, topic: str, done: threading.Event) -> None:
    """About 1,000 records a second, each with 200 bytes of padding."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 2})
    for n in range(TOTAL):
        p.produce(topic, json.dumps({"n": n, "pad": "x" * 200}).encode(), partition=n % PARTITIONS)
        if n % 100 == 99:
            p.poll(0)
            time.sleep(0.1)
    assert p.flush(30) == 0
    done.set()


def test_retention_killed_mid_sweep_keeps_exactly_the_floor_to_the_end(
    broker: TansuBroker, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(PARTITIONS, prefix="retain")
    group = f"retain-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "lane"
    config = tmp_path / "twg.toml"
    log = tmp_path / "gateway.log"
    config.write_text(config_text(broker.bootstrap, topic, group, data))
    layout = LaneLayout(data)
    produced = threading.Event()
    threading.Thread(target=produce, args=(broker.bootstrap, topic, produced), daemon=True).start()
    expected = {q: len(range(q, TOTAL, PARTITIONS)) for q in range(PARTITIONS)}

    def raw_dir(q: int) -> Path:
        return data / "raw" / f"topic={topic}" / f"partition={q}"

    def below_floor(q: int) -> int:
        """Raw files wholly below the floor: raised, not swept yet."""
        floor = layout.floor(topic, q)
        return sum(last < floor for _, last in ranges(raw_dir(q)))

    def ends() -> dict[int, int]:
        return {q: scan_coverage(layout, topic, q).end or 0 for q in range(PARTITIONS)}

    rng = seeded_rng("THALWEG_CRASH_SEED")  # printed: a failing run can be replayed
    mid_sweep = 0  # kills that left a raised floor with files below it still on disk
    kills = 0
    while kills < KILLS or (mid_sweep == 0 and kills < 2 * KILLS):  # one at least mid-way
        kills += 1
        proc = start_gateway(config, log)
        try:
            wait_started(proc)
            time.sleep(rng.uniform(0.8, 2.5))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        mid_sweep += any(below_floor(q) for q in range(PARTITIONS))
        for q in range(PARTITIONS):  # never past what is durable
            assert layout.floor(topic, q) <= (scan_coverage(layout, topic, q).end or 0)
    print(f"{mid_sweep} of {kills} kills left files below a raised floor")
    assert mid_sweep >= 1, "no kill found a sweep pending"
    assert produced.wait(60), "the producer did not finish"

    proc = start_gateway(config, log)
    try:
        wait_started(proc)

        def alive() -> None:
            assert proc.poll() is None, f"gateway exited: {log.read_text()[-2000:]}"

        def settled() -> bool:
            swept = not any(below_floor(q) for q in range(PARTITIONS))
            return ends() == expected and swept and min(map(floor, range(PARTITIONS))) > 0

        def floor(q: int) -> int:
            return layout.floor(topic, q)

        wait_until(settled, 120, lambda: f"ingest and sweeps: {ends()}", check=alive)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    assert temp_files(data) == []
    floors = {q: layout.floor(topic, q) for q in range(PARTITIONS)}
    raw = ds.dataset(data / "raw" / f"topic={topic}", format="parquet").to_table(
        columns=["_twg_source_partition", "_twg_source_offset"]
    )
    for q in range(PARTITIONS):
        offsets = raw.filter(pc.equal(raw["_twg_source_partition"], q))["_twg_source_offset"]
        assert sorted(offsets.to_pylist()) == list(range(floors[q], expected[q])), f"raw {q}"
    decoded = ds.dataset(data / "decoded" / f"topic={topic}", format="parquet").to_table(
        columns=["n"]
    )
    kept = [n for n in range(TOTAL) if n // PARTITIONS >= floors[n % PARTITIONS]]
    assert sorted(decoded["n"].to_pylist()) == kept  # the same rows, once: no lone twin
    assert committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS)) == expected
