"""Crash exactness for Pulsar: ``twg stream`` SIGKILLed while messages stream in.

Pulsar's cursor lives in the broker, so "nothing acknowledged before it is durable" is
checked from the broker's side: a gateway killed with everything received and nothing
yet durable leaves every message unacknowledged on the subscription. And across
repeated kills, every message ends up in the raw lane exactly once (redeliveries are
dropped by position).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
import uuid
from pathlib import Path

import pulsar
import pyarrow.dataset as ds
import pytest

from tests.e2e.test_crash_exactness import start_gateway, wait_started
from tests.helpers import assert_verified, seeded_rng
from tests.pulsar_lite import ExternalPulsar, PulsarLite, drain_subscription
from thalweg.embedded import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
TAIL = 500  # messages produced after the last kill (see the SIGKILL test)


def write_config(
    path: Path,
    url: str,
    topic: str,
    data: Path,
    http_port: int,
    roll_age_s: float,
    max_records_per_s: float = 1e9,
) -> None:
    path.write_text(
        f"""
[gateway]
data_dir = "{data}"
flight_listen = "grpc://127.0.0.1:0"
http_listen = "127.0.0.1:{http_port}"

[raw_lane]
roll_age_s = {roll_age_s}
roll_rows = 2000

[[sources]]
name = "pcrash"
kind = "pulsar"
service_url = "{url}"
topics = ["{topic}"]
subscription = "crash"
subscription_type = "shared"
max_poll_records = 1000
max_records_per_s = {max_records_per_s}
"""
    )


def produce(url: str, topic: str, first: int, count: int, pace_s: float = 0.0) -> None:
    client = pulsar.Client(url, logger=QUIET)
    try:
        p = client.create_producer(
            f"persistent://public/default/{topic}", batching_enabled=True, batching_max_messages=100
        )
        for start in range(first, first + count, 500):
            for n in range(start, min(start + 500, first + count)):
                p.send_async(json.dumps({"n": n}).encode(), None)
            p.flush()
            time.sleep(pace_s)
        p.close()
    finally:
        client.close()


def consumed(http_port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("twg_source_records_total{") and 'source="pcrash"' in line
    )


def lane_values(data: Path, topic: str) -> list[int]:
    root = data / "raw" / f"topic={topic}"
    if not root.exists():
        return []
    # Finished segments only: a segment being written is a .tmp file that may vanish.
    files = [str(f) for f in root.glob("partition=*/*.parquet")]
    if not files:  # the directory is made before its first segment lands
        return []
    table = ds.dataset(files, format="parquet").to_table(columns=["_twg_source_value"])
    return [json.loads(v)["n"] for v in table["_twg_source_value"].to_pylist()]


def test_nothing_is_acknowledged_before_it_is_durable(
    pulsar_broker: PulsarLite | ExternalPulsar, tmp_path: Path
) -> None:
    topic = f"pack-{uuid.uuid4().hex[:8]}"
    produce(pulsar_broker.url, topic, 0, 500)
    data, port = tmp_path / "lane", free_port()
    config = tmp_path / "twg.toml"
    # Segments roll only after 10 minutes: everything received stays in memory.
    write_config(config, pulsar_broker.url, topic, data, port, roll_age_s=600)
    proc = start_gateway(config, tmp_path / "gateway.log")
    try:
        wait_started(proc)
        deadline = time.monotonic() + 30
        while consumed(port) < 500 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert consumed(port) == 500
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert lane_values(data, topic) == []  # nothing was durable...
    seen = pending_on_subscription(pulsar_broker.url, topic, wait_ms=5000, limit=500)
    assert seen == set(range(500))  # ...so nothing was acknowledged
    assert_verified(config)


def test_sigkill_loop_writes_every_message_exactly_once(
    pulsar_broker: PulsarLite | ExternalPulsar, tmp_path: Path
) -> None:
    """SIGKILL mid-ingest, four times. Against pulsar-lite, the broker is restarted
    (same port and storage) after each kill: a consumer whose connection was reset
    stays registered in pulsar-lite for good, and every later subscribe is refused
    with "Consumer 0 already exists" (docs/pulsar.md). A full Pulsar needs no restart."""
    lite = None
    url = pulsar_broker.url
    if isinstance(pulsar_broker, PulsarLite):
        lite = PulsarLite(tmp_path / "broker")
        url = lite.url
    topic = f"pcrash-{uuid.uuid4().hex[:8]}"
    total = 40_000
    data, port = tmp_path / "lane", free_port()
    config = tmp_path / "twg.toml"
    log = tmp_path / "gateway.log"
    # Rate-limited, so that ingest lasts through the kills.
    write_config(config, url, topic, data, port, roll_age_s=0.25, max_records_per_s=4000)
    produce(url, topic, 0, total)
    rng = seeded_rng("THALWEG_CRASH_SEED")  # printed: a failing run can be replayed
    proc = start_gateway(config, log)
    at_kills: list[int] = []  # rows durable when each kill landed
    try:
        for _ in range(4):
            # Each window counts from the gateway's start-up line, not its launch: start-up
            # alone (imports, ~2 s on a loaded machine) could fill a window, and then no
            # kill fell mid-ingest.
            wait_started(proc)
            time.sleep(rng.uniform(0.8, 2.0))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            at_kills.append(len(lane_values(data, topic)))
            if lite is not None:
                lite.stop()
                lite = PulsarLite(tmp_path / "broker", port=lite.port)
            proc = start_gateway(config, log)
        # The rate limiter starts with a full second's burst and each restart refills it, so
        # the last windows may finish the topic; what matters is that kills fell mid-ingest.
        assert any(0 < n < total for n in at_kills), f"the kills missed the ingest: {at_kills}"
        # A tail produced after the kills: the broker delivers it after what a killed
        # gateway made durable but never acknowledged (a delivery is the only way to learn
        # an id to acknowledge), so once the tail is in the lane, the last gateway has been
        # handed those too. Without it a lane complete before the last start was stopped
        # before their redelivery arrived (soak, session 21: 38000.. left unacknowledged).
        produce(url, topic, total, TAIL)
        total += TAIL
        deadline = time.monotonic() + 90
        while len(lane_values(data, topic)) < total and time.monotonic() < deadline:
            assert proc.poll() is None, f"gateway exited: {log.read_text()[-2000:]}"
            time.sleep(0.3)
        wait_started(proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        values = lane_values(data, topic)
        left = pending_on_subscription(url, topic)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        if lite is not None:
            lite.stop()
    assert len(values) == total, (
        f"{len(values)} rows for {total} messages; {len(left)} still unacknowledged "
        f"on the subscription ({min(left, default=None)}..{max(left, default=None)})"
    )
    assert sorted(values) == list(range(total))  # each exactly once
    assert left == set()  # after a graceful stop, everything durable is acknowledged
    assert_verified(config)


def pending_on_subscription(
    url: str, topic: str, wait_ms: int = 2000, limit: int | None = None
) -> set[int]:
    """The message numbers still unacknowledged on the gateway's subscription."""
    payloads = drain_subscription(url, topic, "crash", "shared", wait_ms=wait_ms, limit=limit)
    return {json.loads(p)["n"] for p in payloads}
