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


class LoopingReaders:
    """``n`` threads each reading the topic whole, again and again, until :meth:`stop`;
    ``exact(table)`` says what is wrong with a read (None: nothing). The first failure
    or wrong read of each thread is kept; the row counts of the good reads too."""

    def __init__(
        self,
        gw: thalweg_client.Client,
        topic: str,
        exact: Callable[[pa.Table], str | None],
        n: int = 4,
    ) -> None:
        self.reads: list[int] = []
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(gw, topic, exact), daemon=True)
            for _ in range(n)
        ]
        for t in self._threads:
            t.start()

    def _loop(
        self, gw: thalweg_client.Client, topic: str, exact: Callable[[pa.Table], str | None]
    ) -> None:
        while not self._stop.is_set():
            try:
                table = gw.read(topic)
            except BaseException as exc:  # any failure fails the test
                self.failures.append(exc)
                return
            wrong = exact(table)
            if wrong is not None:
                self.failures.append(AssertionError(wrong))
                return
            self.reads.append(table.num_rows)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def contiguous(table: pa.Table) -> str | None:
    positions = table.column("_twg_position").to_pylist()
    want = list(range(positions[0], positions[0] + len(positions))) if positions else []
    return None if positions == want else f"not contiguous: {positions[:3]}..."


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
    total = produce_json(broker.bootstrap, topic, ({"n": i, "pad": "x" * 200} for i in range(500)))
    rg.wait_durable(topic, {0: total})  # the topic exists before the readers start
    readers = LoopingReaders(gw, topic, contiguous)
    for _ in range(19):
        total += produce_json(
            broker.bootstrap, topic, ({"n": total + i, "pad": "x" * 200} for i in range(500))
        )
        time.sleep(0.2)
    rg.wait_durable(topic, {0: total}, timeout=60)
    wait_until(lambda: layout.floor(topic, 0) > 0, 30, "the floor rising")
    time.sleep(2.5)  # past the grace: files below the floor deleted while readers read
    readers.stop()
    assert readers.failures == [], readers.failures[:1]
    assert len(readers.reads) >= 8 and max(readers.reads) < total  # over a shrinking lane
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

    def exact(table: pa.Table) -> str | None:
        got = table.column("n").to_pylist()
        if got != list(range(len(got))) or table.column("_twg_position").to_pylist() != got:
            return f"not exact: {len(got)} rows"
        return None

    readers = LoopingReaders(gw, topic, exact)
    for _ in range(30):  # small fetches: many small segments for compaction to merge
        total += produce_json(broker.bootstrap, topic, ({"n": total + i} for i in range(100)))
        time.sleep(0.1)
    rg.wait_durable(topic, {0: total}, timeout=60)

    def files() -> int:
        return len(sorted(layout.partition_dir(Lane.RAW, topic, 0).glob("*.parquet")))

    wait_until(lambda: files() <= 6, 60, lambda: f"compaction (now {files()} raw files)")
    readers.stop()
    assert readers.failures == [], readers.failures[:1]
    assert len(readers.reads) >= 8
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


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_retention_by_age_keeps_its_bound_with_compaction_on(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    where: str,
) -> None:
    """Records arrive for 12 s into a lane kept 4 s, merged as soon as two segments
    close. A merged file is as old as its newest record and spans at most a quarter of
    the bound, so the floor keeps rising and nothing much older than the bound is served
    (with compaction on, the floor once never rose: a merge that absorbed each new
    segment was always young)."""
    topic = topic_factory(1, prefix="agecompact")
    gateway: dict[str, object] = {}
    data = tmp_path / "lane"
    if where == "bucket":
        from tests.integration.test_object_store import bucket, store_cfg

        moto = request.getfixturevalue("moto")
        url = f"s3://{bucket(moto)}/lanes"
        gateway = {"data_dir": url, "object_store": store_cfg(moto, url, data)}
    bound = 4.0
    gw = gateway_factory(
        [topic],
        data_dir=data,
        gateway=gateway,
        raw_lane={"roll_age_s": 0.3},
        retention={"max_age_s": bound, "grace_s": 0.5, "interval_s": 0.3},
        compaction={"enabled": True, "min_files": 2, "min_age_s": 0, "interval_s": 0.2},
    )
    client = thalweg_client.connect(gw.flight_url)
    sent_at: dict[int, float] = {}
    layout = LaneLayout(data)
    n, ended = 0, time.monotonic() + 12
    while time.monotonic() < ended:
        produce_json(broker.bootstrap, topic, ({"n": i} for i in range(n, n + 50)))
        now = time.time()
        for i in range(n, n + 50):
            sent_at[i] = now
        n += 50
        time.sleep(0.1)
    gw.wait_durable(topic, {0: n}, timeout=30)
    time.sleep(1.5)  # a retention pass and a sweep after the last records
    floor = layout.floor(topic, 0)
    assert floor > 0, "the floor never rose"
    read = client.read(topic)
    client.close()
    oldest = min(sent_at[i] for i in read.column("n").to_pylist())
    # Kept: at most the bound, a merged file's span (a quarter of it), one retention
    # interval and the grace, and the time since the last record.
    assert time.time() - oldest < bound * 1.25 + 0.3 + 0.5 + 3.0, (floor, n)
    assert layout.segments(Lane.RAW, topic, 0)[0].first >= floor
