"""Compaction under SIGKILL: ``twg stream`` killed again and again while it ingests many
small segments and merges them.

A kill can land between any two steps of a merge (dead letters, decoded, raw written;
the parts deleted ``grace_s`` later). Whatever it leaves, the next start-up repairs: a
merge without its raw file is debris, parts inside a merged file are deleted. At the
end every offset is in the raw lane once and every record in the decoded lane once,
counting every file on disk (not only what a listing shows), and no temp file is left.
"""

from __future__ import annotations

import json
import os
import re
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

from tests.e2e.test_crash_exactness import start_gateway, wait_started
from tests.helpers import committed_offsets, seeded_rng, wait_until
from thalweg.embedded import TansuBroker
from thalweg.lane import LaneLayout, scan_coverage

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 2
TOTAL = 16_000
KILLS = 5
_NAME = re.compile(r"^(\d{20})-(\d{20})\.parquet$")


def config_text(bootstrap: str, topic: str, group: str, data: Path) -> str:
    """Segments of at most 100 rows, and a compaction that merges them as soon as four
    are closed, deleting the parts 2 s later: a kill finds merges in every state."""
    return f"""
[gateway]
data_dir = "{data}"
flight_listen = "grpc://127.0.0.1:0"
http_listen = "127.0.0.1:0"
gc_tuning = false

[raw_lane]
roll_age_s = 0.25
roll_rows = 100

[compaction]
enabled = true
min_files = 4
min_age_s = 0
grace_s = 2.0
interval_s = 0.2

[[sources]]
name = "compact"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "{group}"
session_timeout_ms = 2000
heartbeat_interval_ms = 500
max_poll_records = 100
"""


def ranges(directory: Path) -> list[tuple[int, int]]:
    """The position ranges of the segments in one partition directory."""
    if not directory.is_dir():
        return []
    found = (_NAME.match(f.name) for f in directory.iterdir())
    return sorted((int(m[1]), int(m[2])) for m in found if m)


def nested(spans: list[tuple[int, int]]) -> int:
    """Segments lying inside another (a merge's parts, not deleted yet)."""
    return sum(any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in spans) for s in spans)


def produce(bootstrap: str, topic: str, done: threading.Event) -> None:
    """About 1,000 records a second: records arrive through every kill."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 2})
    for n in range(TOTAL):
        p.produce(topic, json.dumps({"n": n}).encode(), partition=n % PARTITIONS)
        if n % 100 == 99:
            p.poll(0)
            time.sleep(0.1)
    assert p.flush(30) == 0
    done.set()


def temp_files(data: Path) -> list[str]:
    return [str(p) for p in data.rglob("*") if ".tmp-" in p.name]


def test_compaction_killed_mid_merge_loses_and_repeats_nothing(
    broker: TansuBroker, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(PARTITIONS, prefix="compact")
    group = f"compact-{uuid.uuid4().hex[:8]}"
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

    def ends() -> dict[int, int]:
        return {q: scan_coverage(layout, topic, q).end or 0 for q in range(PARTITIONS)}

    rng = seeded_rng("THALWEG_CRASH_SEED")  # printed: a failing run can be replayed
    mid_merge = 0  # kills that left a merge's parts beside it, or a merge's temp files
    kills = 0
    while kills < KILLS or (mid_merge == 0 and kills < 2 * KILLS):  # one at least mid-way
        kills += 1
        proc = start_gateway(config, log)
        try:
            wait_started(proc)
            time.sleep(rng.uniform(0.8, 2.5))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        left = sum(nested(ranges(raw_dir(q))) for q in range(PARTITIONS))
        mid_merge += bool(left or temp_files(data))
    print(f"{mid_merge} of {kills} kills left a merge in progress")
    assert mid_merge >= 1, "no kill found a merge in progress"
    assert produced.wait(60), "the producer did not finish"

    proc = start_gateway(config, log)
    try:
        wait_started(proc)

        def alive() -> None:
            assert proc.poll() is None, f"gateway exited: {log.read_text()[-2000:]}"

        def settled() -> bool:
            spans = [ranges(raw_dir(q)) for q in range(PARTITIONS)]
            return ends() == expected and not any(nested(s) for s in spans)

        wait_until(settled, 120, lambda: f"ingest and merges to finish: {ends()}", check=alive)
        wait_until(
            lambda: all(len(ranges(raw_dir(q))) <= 8 for q in range(PARTITIONS)),
            60,
            lambda: f"compaction: {[len(ranges(raw_dir(q))) for q in range(PARTITIONS)]} files",
            check=alive,
        )
        wait_until(lambda: not any(nested(ranges(raw_dir(q))) for q in range(PARTITIONS)), 30,
                   "the last parts deleted", check=alive)  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    assert temp_files(data) == []
    raw = ds.dataset(data / "raw" / f"topic={topic}", format="parquet").to_table(
        columns=["_twg_source_partition", "_twg_source_offset"]
    )
    for q in range(PARTITIONS):
        offsets = raw.filter(pc.equal(raw["_twg_source_partition"], q))["_twg_source_offset"]
        assert sorted(offsets.to_pylist()) == list(range(expected[q])), f"raw partition {q}"
    decoded = ds.dataset(data / "decoded" / f"topic={topic}", format="parquet").to_table(
        columns=["n"]
    )
    assert sorted(decoded["n"].to_pylist()) == list(range(TOTAL))  # every record once
    merged = [s for q in range(PARTITIONS) for s in ranges(raw_dir(q)) if s[1] - s[0] >= 100]
    assert merged, "nothing was merged"
    assert committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS)) == expected
