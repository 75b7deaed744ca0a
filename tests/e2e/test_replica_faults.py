"""Three ``twg stream`` replicas on one consumer group and one shared lane — a shared
data_dir, or a bucket of an S3 server (moto) with a cache per replica — under faults:
while 200 k records arrive, one replica is SIGKILLed and another SIGSTOPped past its
session timeout, then resumed.

Checked afterwards: every offset is in the shared lane exactly once (no overlapping
segments; in the bucket, as readers resolve generations); the paused replica's late
writes were refused and counted (``twg_fenced_records_total``); a client connected to
any one replica — the one never faulted, and the former zombie — reads the whole topic;
and a follow stream opened through the unfaulted replica before the faults saw every
record exactly once, its partitions following their owners across both rebalances.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.helpers import (
    assert_verified,
    bucket_offsets,
    committed_offsets,
    partition_offsets,
    read_whole,
    start_stream,
    wait_until,
)
from tests.moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer
from thalweg.config.models import ObjectStoreConfig
from thalweg.embedded import TansuBroker, free_port
from thalweg.lane.layout import Lane, LaneLayout
from thalweg.lane.remote.objectstore import ObjectStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 6
TOTAL = 200_000
SESSION_MS = 2000


def write_config(path: Path, bootstrap: str, topic: str, group: str, lane: str) -> tuple[int, int]:
    """One replica's configuration; ``lane`` is the [gateway] lines placing its lane."""
    http, flight = free_port(), free_port()
    path.write_text(
        f"""
[gateway]
flight_listen = "grpc://127.0.0.1:{flight}"
http_listen = "127.0.0.1:{http}"
{lane}

[raw_lane]
roll_age_s = 1.0

[[sources]]
name = "replicas"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "{group}"
format = "none"
session_timeout_ms = {SESSION_MS}
heartbeat_interval_ms = 400
"""
    )
    return flight, http


def shared_dir(data: Path) -> Callable[[str], str]:
    return lambda _name: f'data_dir = "{data}"\nshared_data_dir = true'


def object_store(moto: MotoServer, url: str, caches: Path) -> Callable[[str], str]:
    def lines(name: str) -> str:
        return f"""data_dir = "{url}"

[gateway.object_store]
endpoint_url = "{moto.endpoint}"
region = "{REGION}"
access_key_id = "{ACCESS_KEY}"
secret_access_key = "{SECRET_KEY}"
cache_dir = "{caches / name}"
sync_interval_s = 0.5"""

    return lines


def get_json(http: int, path: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}{path}", timeout=5) as r:
        body: dict[str, object] = json.load(r)
        return body


def metric(http: int, name: str) -> float:
    """The sum of a metric's samples on one replica's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    )


def owners(http: int, topic: str) -> set[str]:
    group = get_json(http, "/stats")["group"]
    assert isinstance(group, dict)
    parts = group["owners"].get(topic, {})
    return set(parts.values()) if len(parts) == PARTITIONS else set()


def produce(bootstrap: str, topic: str, progress: list[int]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10, "log_level": 2})
    for n in range(TOTAL):
        p.produce(topic, json.dumps({"n": n}).encode(), partition=n % PARTITIONS)
        if n % 500 == 499:
            p.poll(0)
            progress[0] = n + 1
            time.sleep(0.04)  # ~12k records/s: every replica always has something buffered
    assert p.flush(60) == 0
    progress[0] = TOTAL


class Follower(threading.Thread):
    def __init__(self, client: thalweg_client.Client, topic: str) -> None:
        super().__init__(daemon=True)
        self.reader = client.stream(topic, lane="raw", end="follow")
        self.seen: Counter[tuple[int, int]] = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for batch in self.reader:
                self.seen.update(partition_offsets(pa.Table.from_batches([batch])))
        except BaseException as exc:
            self.error = exc

    def count(self) -> int:
        if self.error is not None:
            raise self.error
        return sum(self.seen.values())


def lane_offsets(
    data: Path, topic: str, partitions: int = PARTITIONS
) -> tuple[Counter[tuple[int, int]], list[str]]:
    """Every (partition, offset) a shared raw lane holds, counted; overlapping segments."""
    layout = LaneLayout(data)
    seen: Counter[tuple[int, int]] = Counter()
    overlapping = []
    for p in range(partitions):
        segments = layout.segments(Lane.RAW, topic, p)
        for a, b in itertools.pairwise(segments):
            if a.last >= b.first:
                overlapping.append(f"{a.path.name} / {b.path.name}")
        for seg in segments:
            col = pq.read_table(seg.path, columns=["_twg_source_offset"]).column(0)
            seen.update((p, o) for o in col.to_pylist())
    return seen, overlapping


@pytest.mark.parametrize("lane", ["shared-dir", "object-store"])
def test_three_replicas_one_killed_one_paused(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    lane: str,
) -> None:
    topic = topic_factory(PARTITIONS, prefix="replicas")
    group = f"replicas-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "lane"
    store: ObjectStore | None = None
    if lane == "object-store":
        moto: MotoServer = request.getfixturevalue("moto")
        name = f"lanes-{uuid.uuid4().hex[:8]}"
        moto.client().create_bucket(Bucket=name)  # type: ignore[attr-defined]
        url = f"s3://{name}/replicas"
        place = object_store(moto, url, tmp_path / "caches")
        store = ObjectStore(
            ObjectStoreConfig(
                url=url,
                endpoint_url=moto.endpoint,
                region=REGION,
                access_key_id=ACCESS_KEY,
                secret_access_key=SECRET_KEY,
            )
        )
    else:
        place = shared_dir(data)
    ports = [
        write_config(tmp_path / f"{n}.toml", broker.bootstrap, topic, group, place(n))
        for n in "abc"
    ]
    procs: list[subprocess.Popen[bytes]] = []
    progress = [0]
    producer = threading.Thread(target=produce, args=(broker.bootstrap, topic, progress))
    want = {(p, o) for p in range(PARTITIONS) for o in range(len(range(p, TOTAL, PARTITIONS)))}
    try:
        for n in "abc":
            procs.append(start_stream(tmp_path / f"{n}.toml", tmp_path / f"{n}.log"))
        urls = {f"grpc://127.0.0.1:{flight}" for flight, _ in ports}
        for _, http in ports:
            wait_until(lambda h=http: owners(h, topic) == urls, 60, "a three-member map")
        killed, paused = procs[0], procs[1]
        (_, pause_http), (steady_flight, _) = ports[1], ports[2]
        client = thalweg_client.connect(f"grpc://127.0.0.1:{steady_flight}")
        follower = Follower(client, topic)
        follower.start()
        producer.start()

        wait_until(lambda: progress[0] >= TOTAL * 0.3, 120, "30 % produced")
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        # Pause the second one once it ingests again after that rebalance, inside its
        # roll period: it has records buffered that it must never write.
        wait_until(lambda: len(owners(pause_http, topic)) == 2, 60, "a two-member map")
        wait_until(lambda: progress[0] >= TOTAL * 0.5, 120, "50 % produced")
        written = metric(pause_http, "twg_raw_files_written_total")
        wait_until(  # writing again (past restoring its new partitions), and buffering
            lambda: (
                metric(pause_http, "twg_raw_files_written_total") >= written + 2
                and metric(pause_http, "twg_buffered_bytes") > 0
            ),
            60,
            "b ingesting",
        )
        os.kill(paused.pid, signal.SIGSTOP)
        time.sleep(SESSION_MS / 1000 + 3)  # the session expires; the steady one takes over
        os.kill(paused.pid, signal.SIGCONT)
        producer.join(120)
        assert progress[0] == TOTAL

        per = {p: len(range(p, TOTAL, PARTITIONS)) for p in range(PARTITIONS)}

        def committed() -> dict[int, int]:
            return committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS))

        wait_until(lambda: committed() == per, 120, lambda: f"all committed: {committed()}")
        # The follow stream through the steady replica saw every record once.
        wait_until(lambda: follower.count() >= TOTAL, 120, lambda: f"followed {follower.count()}")
        time.sleep(1.0)  # nothing more may arrive
        dupes = {k: n for k, n in follower.seen.items() if n > 1}
        assert not dupes, f"{len(dupes)} records followed twice, e.g. {list(dupes)[:3]}"
        assert set(follower.seen) == want
        client.close()

        # Any one replica serves the whole topic: the steady one and the former zombie.
        # (A replica's copy of an object-store lane is a sync interval old at most.)
        for flight in (steady_flight, ports[1][0]):
            got = read_whole(f"grpc://127.0.0.1:{flight}", topic, TOTAL)
            assert len(got) == TOTAL and set(got) == want, f"via {flight}: {len(got)} rows"

        # The zombie's overdue writes were refused, and counted.
        assert metric(pause_http, "twg_fenced_records_total") >= 1, (
            "the paused replica's late writes were not fenced"
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)
        if producer.is_alive():
            producer.join(120)

    if store is not None:
        seen, overlapping = bucket_offsets(store, topic, PARTITIONS, tmp_path / "check")
    else:
        seen, overlapping = lane_offsets(data, topic)
    assert not overlapping, overlapping
    dupes = {k: n for k, n in seen.items() if n > 1}
    assert not dupes, f"{len(dupes)} offsets in the lane twice, e.g. {list(dupes)[:5]}"
    assert set(seen) == want, f"missing {len(want - set(seen))}"
    assert_verified(tmp_path / "c.toml")  # the shared lane (or the bucket) as a whole
