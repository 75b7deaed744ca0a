"""Retention on a running gateway: while records stream in and four readers read the
whole partition in a loop, the oldest segments go (the lane stays within its bound);
no reader fails and every read is exact — contiguous positions, none twice — because a
floor rises before its files are deleted, after a grace period. Afterwards the earliest
position is the floor, a read below it says so, and a sink that has not landed the
oldest records holds retention back."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import arrow_files, produce_json, wait_until
from thalweg.embedded import TansuBroker, free_port
from thalweg.lane import LaneLayout
from thalweg.lane.layout import Lane

pytestmark = pytest.mark.integration


def test_retention_under_four_readers_keeps_every_read_exact(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    data = tmp_path / "lane"
    rg = gateway_factory(
        [topic],
        data_dir=data,
        raw_lane={"roll_rows": 250},
        retention={"max_bytes": 120_000, "interval_s": 0.3, "grace_s": 1.0},
    )
    layout = LaneLayout(data)
    gw = thalweg_client.connect(rg.flight_url)
    stop = threading.Event()
    reads: list[int] = []
    failures: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                table = gw.read(topic, partitions=[0])
            except BaseException as exc:  # any failure fails the test
                failures.append(exc)
                return
            positions = table.column("_twg_position").to_pylist()
            if positions != list(
                range(positions[0], positions[0] + len(positions)) if positions else []
            ):
                failures.append(AssertionError(f"not contiguous: {positions[:3]}..."))
                return
            reads.append(len(positions))

    total = produce_json(broker.bootstrap, topic, ({"n": i, "pad": "x" * 200} for i in range(500)))
    rg.wait_durable(topic, {0: total})
    threads = [threading.Thread(target=reader, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(19):
        total += produce_json(
            broker.bootstrap, topic, ({"n": total + i, "pad": "x" * 200} for i in range(500))
        )
        time.sleep(0.2)
    rg.wait_durable(topic, {0: total}, timeout=60)
    wait_until(lambda: layout.floor(topic, 0) > 0, 30, "the floor rising")
    time.sleep(2.5)  # past the grace: files below the floor deleted while readers read
    stop.set()
    for t in threads:
        t.join(30)
    assert failures == [], failures[:1]
    assert len(reads) >= 8 and max(reads) < total  # reads happened, over a shrinking lane
    floor = layout.floor(topic, 0)
    raw = sorted(layout.partition_dir(Lane.RAW, topic, 0).glob("*.parquet"))
    assert 2 <= len(raw) <= 12, len(raw)  # 40 segments written, a bounded few kept
    assert int(raw[0].name.split("-")[0]) >= floor  # what is below the floor is gone
    assert gw.describe(topic)["partitions"][0]["earliest"] == floor
    table = gw.read(topic)
    assert table.column("_twg_position")[0].as_py() == floor
    assert table.column("_twg_position").to_pylist() == list(range(floor, total))
    with pytest.raises(
        pa.ArrowInvalid, match=f"removed by retention; the earliest available is {floor}"
    ):
        gw.read(topic, start={"offset": floor - 1})
    metrics = urllib.request.urlopen(f"{rg.admin_url}/metrics").read().decode()
    assert f'twg_lane_floor{{partition="0",topic="{topic}"}} {float(floor)}' in metrics
    gw.close()
    rg.stop()


def test_a_sink_that_has_not_landed_holds_retention_back(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    data = tmp_path / "lane"
    down = [
        {
            "name": "away",
            "kind": "flight",
            "topics": [topic],
            "location": f"grpc://127.0.0.1:{free_port()}",
        }
    ]
    rg = gateway_factory(
        [topic],
        data_dir=data,
        raw_lane={"roll_rows": 250},
        sinks=down,
        recovery={"retry_max_s": 1},
        retention={"max_bytes": 1, "interval_s": 0.3, "grace_s": 0.0},
    )
    n = 0
    for _ in range(4):  # a segment per fetch at least: several segments
        n += produce_json(broker.bootstrap, topic, ({"n": n + i} for i in range(500)))
        rg.wait_durable(topic, {0: n})

    def held() -> bool:
        text = urllib.request.urlopen(f"{rg.admin_url}/metrics").read().decode()
        return f'twg_retention_held{{partition="0",topic="{topic}"}} 1.0' in text

    wait_until(held, 30, "retention held by the sink that is down")
    layout = LaneLayout(data)
    assert layout.floor(topic, 0) == 0
    assert sorted(s.first for s in layout.segments(Lane.RAW, topic, 0))[0] == 0
    rg.stop()


def test_compaction_under_four_readers_and_a_sink_loses_and_repeats_nothing(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    data = tmp_path / "lane"
    sinks = [{"name": "files", "kind": "arrow_ipc", "topics": [topic], "commit_interval_s": 0.2}]
    rg = gateway_factory(
        [topic],
        data_dir=data,
        raw_lane={"roll_rows": 100},
        sinks=sinks,
        compaction={
            "enabled": True,
            "min_age_s": 0.5,
            "min_files": 4,
            "grace_s": 1.0,
            "interval_s": 0.3,
        },
    )
    layout = LaneLayout(data)
    gw = thalweg_client.connect(rg.flight_url)
    total = produce_json(broker.bootstrap, topic, ({"n": i} for i in range(100)))
    rg.wait_durable(topic, {0: total})
    stop = threading.Event()
    reads: list[int] = []
    failures: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                table = gw.read(topic)
            except BaseException as exc:  # any failure fails the test
                failures.append(exc)
                return
            got = table.column("n").to_pylist()
            if got != list(range(len(got))) or table.column("_twg_position").to_pylist() != got:
                failures.append(AssertionError(f"not exact: {len(got)} rows"))
                return
            reads.append(len(got))

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(30):  # small fetches: many small segments for compaction to merge
        total += produce_json(broker.bootstrap, topic, ({"n": total + i} for i in range(100)))
        time.sleep(0.1)
    rg.wait_durable(topic, {0: total}, timeout=60)

    def files() -> int:
        return len(sorted(layout.partition_dir(Lane.RAW, topic, 0).glob("*.parquet")))

    wait_until(lambda: files() <= 6, 60, lambda: f"compaction (now {files()} raw files)")
    stop.set()
    for t in threads:
        t.join(30)
    assert failures == [], failures[:1]
    assert len(reads) >= 8
    table = gw.read(topic)
    assert table.column("n").to_pylist() == list(range(total))  # exact after the merges
    wait_until(
        lambda: arrow_files(data / "sinks" / "files").num_rows == total, 60, "the sink complete"
    )
    assert sorted(arrow_files(data / "sinks" / "files").column("n").to_pylist()) == list(
        range(total)
    )
    metrics = urllib.request.urlopen(f"{rg.admin_url}/metrics").read().decode()
    assert f'twg_compaction_merged_files_total{{topic="{topic}"}}' in metrics
    gw.close()
    rg.stop()
