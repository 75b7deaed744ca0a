"""A zombie member: ``twg stream`` SIGSTOPped past its session timeout while a second
gateway takes its partitions, then resumed.

Whatever the paused member had buffered is overdue when it wakes; before fencing it
wrote those segments for partitions it no longer owned (duplicates across two lanes,
overlapping files in a shared one). Now, for separate and for shared data dirs: every
offset is in the lanes exactly once, no lane holds overlapping segments, the paused
member renames nothing for the partitions it lost, and a Flight read of the shared lane
through either replica returns every position once.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import thalweg_client
from tests.helpers import (
    assert_verified,
    committed_offsets,
    produce_until_stopped,
    seeded_rng,
    start_stream,
    wait_until,
)
from thalweg.embedded import TansuBroker, free_port
from thalweg.lane.layout import Lane, LaneLayout

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 2
SESSION_MS = 2000


def write_config(
    path: Path, bootstrap: str, topic: str, group: str, data: Path, shared: bool
) -> int:
    http, flight = free_port(), free_port()
    path.write_text(
        f"""
[gateway]
data_dir = "{data}"
shared_data_dir = {str(shared).lower()}
flight_listen = "grpc://127.0.0.1:{flight}"
http_listen = "127.0.0.1:{http}"

[raw_lane]
roll_age_s = 1.5
roll_rows = 1000000

[[sources]]
name = "zombie"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "{group}"
session_timeout_ms = {SESSION_MS}
heartbeat_interval_ms = 400
"""
    )
    return flight


def produce(bootstrap: str, topic: str, stop: threading.Event, sent: list[int]) -> None:
    # ~2k records/s: every gateway always has something buffered
    produce_until_stopped(bootstrap, topic, PARTITIONS, stop, sent, per_tick=200, tick_s=0.1)


def offsets(data: Path, topic: str) -> Counter[tuple[int, int]]:
    layout = LaneLayout(data)
    seen: Counter[tuple[int, int]] = Counter()
    for p in range(PARTITIONS):
        for seg in layout.segments(Lane.RAW, topic, p):
            col = pq.read_table(seg.path, columns=["_twg_source_offset"]).column(0)
            seen.update((p, o) for o in col.to_pylist())
    return seen


def overlaps(data: Path, topic: str) -> list[str]:
    layout = LaneLayout(data)
    bad = []
    for p in range(PARTITIONS):
        for a, b in itertools.pairwise(layout.segments(Lane.RAW, topic, p)):
            if a.last >= b.first:
                bad.append(f"{a.path.name} / {b.path.name}")
    return bad


def renamed_between(data: Path, topic: str, start: float, end: float) -> list[str]:
    """Raw segments whose name appeared (ctime: the link that made it durable) in
    ``[start, end)``."""
    layout = LaneLayout(data)
    return [
        f"{p}/{seg.path.name}"
        for p in range(PARTITIONS)
        for seg in layout.segments(Lane.RAW, topic, p)
        if start <= seg.path.stat().st_ctime < end
    ]


@pytest.mark.parametrize("shared", [False, True], ids=["separate-dirs", "shared-dir"])
def test_a_paused_member_writes_nothing_for_partitions_it_lost(
    broker: TansuBroker, topic_factory: Callable[..., str], tmp_path: Path, shared: bool
) -> None:
    rng = seeded_rng("THALWEG_ZOMBIE_SEED")
    topic = topic_factory(PARTITIONS, prefix="zombie")
    group = f"zombie-{uuid.uuid4().hex[:8]}"
    dirs = [tmp_path / "lane"] * 2 if shared else [tmp_path / "lane-a", tmp_path / "lane-b"]
    flights = [
        write_config(tmp_path / f"{n}.toml", broker.bootstrap, topic, group, d, shared)
        for n, d in zip("ab", dirs, strict=True)
    ]
    stop_producing, sent = threading.Event(), []
    producer = threading.Thread(
        target=produce, args=(broker.bootstrap, topic, stop_producing, sent)
    )
    producer.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(start_stream(tmp_path / "a.toml", tmp_path / "a.log"))
        wait_until(lambda: offsets(dirs[0], topic), 30, "gateway a writing")
        procs.append(start_stream(tmp_path / "b.toml", tmp_path / "b.log"))
        wait_until(lambda: offsets(dirs[1], topic) if not shared else True, 30, "gateway b writing")
        time.sleep(1.0 + rng.random())  # somewhere inside a's roll period
        os.kill(procs[0].pid, signal.SIGSTOP)
        time.sleep(SESSION_MS / 1000 + 3)  # the session expires; b takes everything
        resumed = time.time()
        os.kill(procs[0].pid, signal.SIGCONT)
        time.sleep(2.0)  # a wakes up with overdue buffers, and rejoins
        if not shared:
            # In its first second awake a owns nothing (b holds every partition until a
            # rebalance, and a's next roll is 1.5 s away): whatever it renamed then is an
            # overdue zombie segment. (Shared: a's files are b's too; the exactly-once
            # and overlap checks below speak for it.)
            zombie = renamed_between(dirs[0], topic, resumed, resumed + 1.0)
            assert not zombie, f"the paused member renamed segments on waking: {zombie}"
        time.sleep(2.0)
        stop_producing.set()
        producer.join(60)
        total = sent[0]
        per_partition = {p: len(range(p, total, PARTITIONS)) for p in range(PARTITIONS)}
        wait_until(
            lambda: (
                committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS))
                == per_partition
            ),
            60,
            lambda: (
                f"every record committed: {per_partition}, have "
                f"{committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS))}"
            ),
        )
        if shared:
            with thalweg_client.connect(f"grpc://127.0.0.1:{flights[1]}") as client:
                table = client.read(topic, lane="raw")
            pairs = list(
                zip(
                    table.column("_twg_source_partition").to_pylist(),
                    table.column("_twg_source_offset").to_pylist(),
                    strict=True,
                )
            )
            # Any replica serves a shared lane in full: every position once.
            assert len(pairs) == len(set(pairs)), (len(pairs), len(set(pairs)), total)
            want_pairs = {(p, o) for p in range(PARTITIONS) for o in range(per_partition[p])}
            assert set(pairs) == want_pairs, len(want_pairs - set(pairs))
    finally:
        stop_producing.set()
        producer.join(60)
        for proc in procs:
            os.kill(proc.pid, signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)
    seen: Counter[tuple[int, int]] = Counter()
    for d in set(dirs):
        seen += offsets(d, topic)
        assert not overlaps(d, topic), overlaps(d, topic)
    dupes = {k: n for k, n in seen.items() if n > 1}
    want = {(p, o) for p in range(PARTITIONS) for o in range(per_partition[p])}
    assert not dupes, f"{len(dupes)} offsets in the lanes more than once, e.g. {list(dupes)[:5]}"
    assert set(seen) == want, f"missing {len(want - set(seen))}, extra {len(set(seen) - want)}"
    assert b"ownership" in (tmp_path / "a.log").read_bytes(), "the fence never doubted"
    if shared:  # a lane of its own per replica is verified at each partition's owner
        assert_verified(tmp_path / "a.toml")
