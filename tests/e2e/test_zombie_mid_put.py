"""A zombie frozen mid-PUT: lanes in a bucket (a moto S3 server), gateway ``a`` reaches
it through a proxy that holds its requests. While records arrive, the proxy holds ``a``'s
PUT of a raw object — sent after its fence said yes, not yet in the store — and ``a`` is
SIGSTOPped there, past its session. Gateway ``b`` takes every partition, restores them
from the bucket (without that object: it never landed) and writes the same positions
again under its newer generation. Then the held PUT is released and lands, late, in the
bucket; ``a`` is resumed, learns it lost its partitions, rejoins.

Checked afterwards: the late object is in the bucket, and yet the lane as every reader
resolves it holds each offset exactly once with no two objects overlapping; every offset
is committed; a read through ``b`` returns each position once; ``twg verify`` over the
bucket finds nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.helpers import (
    assert_verified,
    bucket_offsets,
    committed_offsets,
    partition_offsets,
    start_stream,
    wait_until,
)
from tests.hold_proxy import HoldingProxy
from tests.moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer
from thalweg.embedded import TansuBroker, free_port
from thalweg.lane.layout import Lane, LaneLayout
from thalweg.lane.remote.mirror import LaneMirror
from thalweg.lane.remote.objectstore import ObjectStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 2
SESSION_MS = 2000


def write_config(
    path: Path, bootstrap: str, topic: str, group: str, url: str, endpoint: str, cache: Path
) -> int:
    flight = free_port()
    path.write_text(
        f"""
[gateway]
data_dir = "{url}"
flight_listen = "grpc://127.0.0.1:{flight}"
http_listen = "127.0.0.1:{free_port()}"

[gateway.object_store]
endpoint_url = "{endpoint}"
region = "{REGION}"
access_key_id = "{ACCESS_KEY}"
secret_access_key = "{SECRET_KEY}"
cache_dir = "{cache}"
sync_interval_s = 0.5

[raw_lane]
roll_age_s = 0.3

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
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 2})
    n = 0
    while not stop.is_set():
        for _ in range(100):
            p.produce(topic, json.dumps({"n": n}).encode(), partition=n % PARTITIONS)
            n += 1
        p.poll(0)
        time.sleep(0.1)  # ~1k records/s: a roll every 0.3 s always has rows
    assert p.flush(30) == 0
    sent.append(n)


def test_a_put_that_lands_after_its_writer_froze_mid_put_changes_no_reader(
    broker: TansuBroker, topic_factory: Callable[..., str], moto: MotoServer, tmp_path: Path
) -> None:
    topic = topic_factory(PARTITIONS, prefix="midput")
    group = f"midput-{uuid.uuid4().hex[:8]}"
    url = moto.bucket_url()
    name = url.split("/")[2]
    proxy = HoldingProxy(moto.port)
    write_config(
        tmp_path / "a.toml", broker.bootstrap, topic, group, url, proxy.endpoint, tmp_path / "a"
    )
    flight_b = write_config(
        tmp_path / "b.toml", broker.bootstrap, topic, group, url, moto.endpoint, tmp_path / "b"
    )
    store: ObjectStore = moto.store(url)  # type: ignore[assignment]
    mirror = LaneMirror(LaneLayout(tmp_path / "unused"), store)

    def raw_objects() -> set[str]:
        return {o.rel for p in range(PARTITIONS) for o in mirror.objects(Lane.RAW, topic, p)}

    stop_producing, sent = threading.Event(), []
    producer = threading.Thread(
        target=produce, args=(broker.bootstrap, topic, stop_producing, sent)
    )
    producer.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(start_stream(tmp_path / "a.toml", tmp_path / "a.log"))
        wait_until(lambda: len(raw_objects()) >= 4, 30, "gateway a writing to the bucket")

        def raw_put(request: str) -> bool:
            return request.startswith("PUT ") and "/raw/" in request

        proxy.hold(when=raw_put)  # its twins went through: the raw PUT is the durable one
        wait_until(
            lambda: any(map(raw_put, proxy.held_requests)),
            20,
            lambda: f"a raw PUT of gateway a held in flight (held: {proxy.held_requests})",
        )
        os.kill(procs[0].pid, signal.SIGSTOP)  # frozen mid-PUT
        held = next(filter(raw_put, proxy.held_requests))
        path = unquote(held.split(" ", 1)[1].split("?", 1)[0])
        key = path.split(f"/{name}/lane/", 1)[1]
        assert key not in raw_objects()
        before = raw_objects()
        procs.append(start_stream(tmp_path / "b.toml", tmp_path / "b.log"))
        # b takes every partition once a's session expired, and writes past a's objects.
        wait_until(lambda: len(raw_objects() - before) >= 6, 60, "gateway b writing")
        # The zombie wakes with its PUT on the wire (headers, perhaps its body too: the
        # rest follows once it runs); it lands now, late, under a's old generation.
        proxy.release()
        os.kill(procs[0].pid, signal.SIGCONT)
        wait_until(
            lambda: key in raw_objects(),
            20,
            lambda: f"the held PUT of {key} landed in the bucket: {sorted(raw_objects())[-6:]}",
        )
        time.sleep(3.0)  # a wakes, learns it lost its partitions, rejoins
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
        seen, overlapping = bucket_offsets(store, topic, PARTITIONS, tmp_path / "check")
        want = {(p, o) for p in range(PARTITIONS) for o in range(per_partition[p])}
        assert overlapping == []
        assert {k for k, n in seen.items() if n > 1} == set()
        assert set(seen) == want, f"missing {len(want - set(seen))}"
        with thalweg_client.connect(f"grpc://127.0.0.1:{flight_b}") as client:
            wait_until(
                lambda: client.read(topic, lane="raw").num_rows == len(want), 30, "b serves all"
            )
            pairs = partition_offsets(client.read(topic, lane="raw"))
        assert len(pairs) == len(set(pairs)) and set(pairs) == want
    finally:
        stop_producing.set()
        producer.join(60)
        proxy.release()
        for proc in procs:
            os.kill(proc.pid, signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)
        proxy.close()
    assert key in raw_objects(), "the late object is in the bucket, resolved away"
    assert_verified(tmp_path / "b.toml")
