"""What the crash tests of lane upkeep (compaction, retention) share: a gateway of small
segments on tansu fed about 1,000 records a second, SIGKILLed again and again, then run
until the lanes settle and stopped; and readings of the lane's files on disk."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
from confluent_kafka import Producer

from tests.e2e.test_crash_exactness import config_text as crash_config
from tests.e2e.test_crash_exactness import start_gateway, wait_started
from tests.helpers import wait_until

PARTITIONS = 2
TOTAL = 16_000
KILLS = 5
_NAME = re.compile(r"^(\d{20})-(\d{20})\.parquet$")


def config_text(bootstrap: str, topic: str, group: str, data: Path, upkeep: str) -> str:
    """Segments of at most 100 rows, fetched 100 at a time, and the ``upkeep`` tables."""
    return crash_config(
        bootstrap,
        topic,
        group,
        data,
        roll_rows=100,
        max_poll_records=100,
        gateway="gc_tuning = false",
        extra=upkeep,
    )


def produce(bootstrap: str, topic: str, pad: int) -> threading.Event:
    """Start producing ``TOTAL`` records (``{"n": i}`` with ``pad`` bytes of padding),
    about 1,000 a second so that records arrive through every kill; set when done."""
    done = threading.Event()

    def run() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 2})
        for n in range(TOTAL):
            doc = {"n": n, "pad": "x" * pad} if pad else {"n": n}
            p.produce(topic, json.dumps(doc).encode(), partition=n % PARTITIONS)
            if n % 100 == 99:
                p.poll(0)
                time.sleep(0.1)
        assert p.flush(30) == 0
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


@dataclass
class Kills:
    """How many kills there were, and how many found the upkeep mid-way."""

    total: int
    mid_way: int


def kill_repeatedly(
    config: Path, log: Path, rng: random.Random, mid_way: Callable[[], bool]
) -> Kills:
    """Start the gateway and SIGKILL it, ``KILLS`` times — more (up to twice that) until
    one kill at least finds ``mid_way()`` true afterwards."""
    kills = Kills(0, 0)
    while kills.total < KILLS or (kills.mid_way == 0 and kills.total < 2 * KILLS):
        kills.total += 1
        proc = start_gateway(config, log)
        try:
            wait_started(proc)
            time.sleep(rng.uniform(0.8, 2.5))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        kills.mid_way += mid_way()
    return kills


def run_until_settled(config: Path, log: Path, settled: Callable[[], bool], what: str) -> None:
    """Start the gateway, wait until ``settled()``, and stop it gracefully (exit 0)."""
    proc = start_gateway(config, log)
    try:
        wait_started(proc)

        def alive() -> None:
            assert proc.poll() is None, f"gateway exited: {log.read_text()[-2000:]}"

        wait_until(settled, 120, what, check=alive)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def ranges(directory: Path) -> list[tuple[int, int]]:
    """The position ranges of the segments in one partition directory."""
    if not directory.is_dir():
        return []
    found = (_NAME.match(f.name) for f in directory.iterdir())
    return sorted((int(m[1]), int(m[2])) for m in found if m)


def nested(spans: list[tuple[int, int]]) -> int:
    """Segments lying inside another (a merge's parts, not deleted yet)."""
    return sum(any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in spans) for s in spans)


def temp_files(data: Path) -> list[str]:
    return [str(p) for p in data.rglob("*") if ".tmp-" in p.name]


def lane_files(data: Path, lane: str, topic: str, columns: list[str]) -> pa.Table:
    """Every file of a lane's topic on disk, read whole (not what a listing shows)."""
    return ds.dataset(data / lane / f"topic={topic}", format="parquet").to_table(columns=columns)
