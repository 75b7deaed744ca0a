"""Crash exactness: SIGKILL ``twg stream`` repeatedly while records stream in.

At the end every offset of every partition is in the raw lane exactly once, and at no
observed moment was the committed offset ahead of the lane's durable coverage.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.helpers import assert_verified, committed_offsets, seeded_rng, wait_until
from thalweg.embedded import TansuBroker
from thalweg.lane import Lane, LaneLayout, scan_coverage

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 3
TOTAL = 120_000
KILLS = 5
ROLL_ROWS = 1500


def config_text(
    bootstrap: str,
    topic: str,
    group: str,
    data: Path,
    *,
    roll_rows: int = 5000,
    max_poll_records: int = 2000,
    gateway: str = "",
    extra: str = "",
) -> str:
    """A crash test's gateway: fast rolls, a short session, then ``extra`` tables
    (``gateway``: more keys of ``[gateway]``)."""
    return f"""
[gateway]
data_dir = "{data}"
flight_listen = "grpc://127.0.0.1:0"
http_listen = "127.0.0.1:0"
{gateway}

[raw_lane]
roll_age_s = 0.25
roll_rows = {roll_rows}

[[sources]]
name = "crash"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "{group}"
session_timeout_ms = 2000
heartbeat_interval_ms = 500
max_poll_records = {max_poll_records}
{extra}"""


def write_config(path: Path, bootstrap: str, topic: str, group: str, data: Path) -> None:
    path.write_text(config_text(bootstrap, topic, group, data))


def start_gateway(config: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "thalweg.cli.main",
            "--log-level",
            "warning",
            "stream",
            "--config",
            str(config),
        ],
        stdout=subprocess.PIPE,
        stderr=open(log, "ab"),
        start_new_session=True,
    )


def wait_started(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Block until the gateway printed its start-up line (its signal handlers are set)."""
    out = proc.stdout
    assert out is not None
    line: list[bytes] = []
    reader = threading.Thread(target=lambda: line.append(out.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert line and line[0].startswith(b"thalweg"), f"gateway did not start: {line}"


def produce(bootstrap: str, topic: str, done: threading.Event) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 2})
    sent = 0
    while sent < TOTAL:
        for _ in range(2000):
            p.produce(topic, json.dumps({"n": sent}).encode(), partition=sent % PARTITIONS)
            sent += 1
        p.poll(0)
        time.sleep(0.2)  # ~10k records/s: the stream runs through every kill
    p.flush(30)
    done.set()


def test_sigkill_loses_and_duplicates_nothing(
    broker: TansuBroker, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(PARTITIONS, prefix="crash")
    group = f"crash-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "lane"
    config = tmp_path / "twg.toml"
    log = tmp_path / "gateway.log"
    # Segments closed by rows as well as by age, at a limit that 2,000-record polls
    # cross mid-fetch: takes are cut at the limit and the rest carried, through kills.
    config.write_text(config_text(broker.bootstrap, topic, group, data, roll_rows=ROLL_ROWS))
    layout = LaneLayout(data)

    observer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "log_level": 2,
            "enable.auto.commit": False,
        }
    )
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    violations: list[str] = []
    observations = 0
    stop_watch = threading.Event()

    def watch() -> None:
        nonlocal observations
        while not stop_watch.is_set():
            committed = observer.committed(tps, timeout=5)  # read commits first...
            for tp in committed:
                if tp.offset < 0:
                    continue
                cov = scan_coverage(layout, topic, tp.partition)  # ...then the lane
                end = cov.end_of_run(0) if cov.ranges and cov.ranges[0][0] == 0 else None
                if end is None or tp.offset > end:
                    violations.append(f"p{tp.partition}: committed {tp.offset} > lane {end}")
            observations += 1
            time.sleep(0.05)

    produced = threading.Event()
    threading.Thread(target=produce, args=(broker.bootstrap, topic, produced), daemon=True).start()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    rng = seeded_rng("THALWEG_CRASH_SEED")  # printed: a failing run can be replayed
    proc = start_gateway(config, log)
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(1.5, 4.0))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            proc = start_gateway(config, log)
        assert produced.wait(120), "producer did not finish"
        # Let the last gateway catch up, then stop it gracefully.
        expected = {p: len(range(p, TOTAL, PARTITIONS)) for p in range(PARTITIONS)}

        def ends() -> dict[int, int]:
            return {p: scan_coverage(layout, topic, p).end or 0 for p in range(PARTITIONS)}

        def alive() -> None:
            assert proc.poll() is None, f"gateway exited: {log.read_text()[-2000:]}"

        wait_until(
            lambda: ends() == expected,
            90,
            lambda: f"the lane to catch up: {ends()} != {expected}",
            interval=0.2,
            check=alive,
        )
        wait_started(proc)  # a graceful stop is asserted, not a stop during start-up
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        stop_watch.set()
        watcher.join(10)
        observer.close()

    assert observations > 20, "the commit/coverage watcher hardly ran"
    assert violations == [], violations[:5]

    lane = ds.dataset(data / "raw" / f"topic={topic}", format="parquet").to_table(
        columns=["_twg_source_partition", "_twg_source_offset", "_twg_source_value"]
    )
    for p in range(PARTITIONS):
        offsets = lane.filter(pc.equal(lane["_twg_source_partition"], p))["_twg_source_offset"]
        n = expected[p]
        assert len(offsets) == n, f"partition {p}: {len(offsets)} rows for {n} records"
        assert pc.count_distinct(offsets).as_py() == n, f"partition {p} has duplicates"
        assert pc.min(offsets).as_py() == 0 and pc.max(offsets).as_py() == n - 1
    values = sorted(json.loads(v)["n"] for v in lane["_twg_source_value"].to_pylist())
    assert values == list(range(TOTAL))
    sizes = [
        s.last - s.first + 1 for p in range(PARTITIONS) for s in layout.segments(Lane.RAW, topic, p)
    ]
    assert max(sizes) == ROLL_ROWS, "no segment closed by rows, or one over the limit"
    # The final committed offsets equal the lane's end (graceful stop commits all).
    assert committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS)) == expected
    assert_verified(config)
