"""Operator endpoints on a running gateway."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from tests.conftest import RunningGateway
from tests.helpers import consume_confluent, wait_until

pytestmark = pytest.mark.integration


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_live_ready_health_metrics(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(2)
    for i in range(40):
        producer.produce(topic, b'{"i": %d}' % i, partition=i % 2)
    producer.produce(topic, b"not json", partition=0)
    producer.flush(10)
    gw = gateway_factory([topic])
    gw.wait_durable(topic, {0: 21, 1: 20})

    assert get(gw.admin_url + "/live")[0] == 200
    status, body = get(gw.admin_url + "/ready")
    assert status == 200 and json.loads(body)["ready"] is True
    status, body = get(gw.admin_url + "/health")
    tree = json.loads(body)
    assert status == 200
    assert tree["components"]["raw_lane"]["state"] == "up"
    assert tree["components"]["source:test"]["gates_readiness"] is True
    assert tree["components"]["flight"]["gates_readiness"] is False
    assert get(gw.admin_url + "/nope")[0] == 404

    _, text = get(gw.admin_url + "/metrics")
    metrics = text.decode()
    labels = f'partition="0",source="test",topic="{topic}"'
    assert f"twg_partition_durable_position{{{labels}}} 21.0" in metrics
    assert f"twg_partition_committed_position{{{labels}}} 21.0" in metrics
    assert f"twg_partition_consumed_position{{{labels}}} 21.0" in metrics
    assert f"twg_source_records_total{{{labels}}} 21.0" in metrics
    assert f'twg_decode_failures_total{{reason="syntax",topic="{topic}"}} 1.0' in metrics
    assert f'twg_raw_rows_written_total{{topic="{topic}"}} 41.0' in metrics

    gw.stop()
    # After a graceful stop nothing is ready any more, but the lane stays readable.
    assert gw.gateway.health.ready() is False


def test_poison_records_reach_the_dead_letter_lane(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    """2 % poison: every bad record is in the DLQ with its reason and locator, every good
    record decodes, and the DLQ segment is durable before the offset is committed."""
    import pyarrow.parquet as pq

    import thalweg_client

    topic = topic_factory(2)
    poison = set(range(0, 1000, 100)) | set(range(51, 1000, 100))  # both partitions, 2 %
    for i in range(1000):
        value = b'{"i": ' if i in poison else b'{"i": %d}' % i
        producer.produce(topic, value, key=str(i).encode(), partition=i % 2)
    producer.flush(10)
    gw = gateway_factory([topic])
    gw.wait_durable(topic, {0: 500, 1: 500})
    with thalweg_client.connect(gw.flight_url) as client:
        dlq = client.read(topic, lane="dlq")
        decoded = client.read(topic, metadata="none")
    assert sorted(int(k) for k in dlq["_twg_source_key"].to_pylist()) == sorted(poison)
    assert set(dlq["_twg_dlq_reason"].to_pylist()) == {"syntax"}
    assert set(dlq["_twg_dlq_stage"].to_pylist()) == {"decode"}
    assert dlq["_twg_source_value"].to_pylist() == [b'{"i": '] * len(poison)
    assert sorted(decoded["i"].to_pylist()) == [i for i in range(1000) if i not in poison]
    # On disk: every DLQ segment has its raw twin (it was written first, same name).
    for p in (0, 1):
        dlq_dir = gw.data_dir / "dlq" / f"topic={topic}" / f"partition={p}"
        raw_dir = gw.data_dir / "raw" / f"topic={topic}" / f"partition={p}"
        names = [f.name for f in dlq_dir.iterdir()]
        assert names and all((raw_dir / n).exists() for n in names)
        assert sum(pq.read_metadata(dlq_dir / n).num_rows for n in names) == 10
    metrics = gw.gateway.metrics.exposition().decode()
    assert f'twg_dlq_records_total{{topic="{topic}"}} 20.0' in metrics


def test_unwritable_raw_lane_flips_ready_and_recovers_without_loss(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    """The partition's lane directory is replaced by a plain file (root ignores
    permissions, not that): /ready goes 503, /live stays 200, nothing is committed past
    what is durable; once the directory is back, writes resume and nothing is lost."""

    topic = topic_factory(1)
    gw = gateway_factory([topic], format="none")
    for i in range(50):
        producer.produce(topic, b"a%d" % i, partition=0)
    producer.flush(10)
    gw.wait_durable(topic, {0: 50})
    assert get(gw.admin_url + "/ready")[0] == 200

    part = gw.data_dir / "raw" / f"topic={topic}" / "partition=0"
    aside = part.with_name("partition=0.aside")
    part.rename(aside)
    part.write_bytes(b"not a directory")
    try:
        for i in range(50, 100):
            producer.produce(topic, b"a%d" % i, partition=0)
        producer.flush(10)
        # Within two probe periods of the default 10 s.
        wait_until(lambda: get(gw.admin_url + "/ready")[0] == 503, 20, "/ready to turn 503")
        assert get(gw.admin_url + "/live")[0] == 200
        health = json.loads(get(gw.admin_url + "/health")[1])
        assert health["components"]["raw_lane"]["state"] == "down"
        retries = gw.gateway.metrics.retries.labels("write")
        wait_until(lambda: retries._value.get() >= 2, 20, "a few failed write attempts")
        state = gw.gateway.live.state(topic, 0)
        assert state is not None
        assert state.committed == 50  # not one offset past what is durable
    finally:
        part.unlink()
        aside.rename(part)
    gw.wait_durable(topic, {0: 100})
    wait_until(lambda: get(gw.admin_url + "/ready")[0] == 200, 20, "/ready to recover")
    import thalweg_client

    with thalweg_client.connect(gw.flight_url) as client:
        values = client.read(topic, lane="raw").column("_twg_source_value").to_pylist()
    assert sorted(values, key=lambda v: int(v[1:])) == [b"a%d" % i for i in range(100)]


def test_stats_attributes_work_to_stages_and_names_a_stalled_one(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:

    topic = topic_factory(1)
    gw = gateway_factory([topic], gateway={"stall_after_s": 1.0})
    for i in range(500):
        producer.produce(topic, json.dumps({"i": i}).encode(), partition=0)
    producer.flush(10)
    gw.wait_durable(topic, {0: 500})
    wait_until(  # the commit follows the write
        lambda: getattr(gw.gateway.live.state(topic, 0), "committed", None) == 500,
        15,
        "offset 500 committed",
    )
    status, body = get(gw.admin_url + "/stats")
    stats = json.loads(body)
    assert status == 200
    assert stats["window_s"] == 30
    for stage in ("fetch", "decode", "write", "commit"):
        assert stats["stages"][stage]["records_per_s"] > 0, stage
    assert stats["stages"]["decode"]["bytes_per_s"] > 0
    assert stats["stalled"] == []

    # Hang the disk: records wait for the write stage, and /stats says so by name.
    release = gw.hold_writes()
    try:
        for i in range(500, 600):
            producer.produce(topic, json.dumps({"i": i}).encode(), partition=0)
        producer.flush(10)
        stats = wait_until(
            lambda: (s := json.loads(get(gw.admin_url + "/stats")[1]))["stalled"] and s,
            20,
            "/stats to name a stalled stage",
            interval=0.2,
        )
        assert stats["stalled"] == ["write"]
        assert stats["stages"]["write"]["queue_depth"] == 100
    finally:
        release.set()
    gw.wait_durable(topic, {0: 600})


def test_dead_letters_also_go_to_a_kafka_topic(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    """``dlq_topic``: every poison record is produced there, original key/value/headers
    intact, with __twg.errors.* headers naming reason, stage and locator — before the
    offset is committed."""
    topic, dlq_topic = topic_factory(1), topic_factory(1, prefix="dlq")
    poison = {3, 7}
    for i in range(10):
        value = b"{broken" if i in poison else json.dumps({"i": i}).encode()
        producer.produce(topic, value, key=b"k%d" % i, headers=[("h", b"v")], partition=0)
    producer.flush(10)
    gw = gateway_factory([topic], dlq_topic=dlq_topic)
    gw.wait_durable(topic, {0: 10})
    state = gw.gateway.live.state(topic, 0)
    assert state is not None

    bootstrap = gw.gateway.cfg.sources[0].bootstrap_servers
    got = consume_confluent(bootstrap, dlq_topic, len(poison))  # read from the start
    assert len(got) == len(poison)
    for m in got:
        headers = dict(m.headers)
        offset = int(headers["__twg.errors.offset"])
        assert offset in poison
        assert m.key == b"k%d" % offset
        assert m.value == b"{broken"
        assert headers["h"] == b"v"
        assert headers["__twg.errors.reason"] == b"syntax"
        assert headers["__twg.errors.stage"] == b"decode"
        assert headers["__twg.errors.topic"] == topic.encode()
        assert headers["__twg.errors.partition"] == b"0"
        assert headers["__twg.errors.message"]


def test_oversize_records_go_to_the_dead_letter_lane(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    import thalweg_client

    topic = topic_factory(1)
    big = json.dumps({"i": 2, "pad": "x" * 500}).encode()
    for value in (b'{"i": 0}', b'{"i": 1}', big, b'{"i": 3}'):
        producer.produce(topic, value, partition=0)
    producer.flush(10)
    gw = gateway_factory([topic], max_record_bytes=100)
    gw.wait_durable(topic, {0: 4})
    with thalweg_client.connect(gw.flight_url) as client:
        dlq = client.read(topic, lane="dlq")
        decoded = client.read(topic, metadata="none")
        raw = client.read(topic, lane="raw")
    assert dlq["_twg_dlq_reason"].to_pylist() == ["oversize"]
    assert dlq["_twg_source_value"].to_pylist() == [big]  # whole, as consumed
    assert dlq["_twg_source_offset"].to_pylist() == [2]
    assert sorted(decoded["i"].to_pylist()) == [0, 1, 3]
    assert raw.num_rows == 4


def test_a_large_dead_letter_reaches_the_lane_and_the_dlq_topic(
    topic_factory: Callable[..., str],
    broker: object,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    """A 2 MiB poison record (twice the producer's batch size) is dead-lettered whole to
    the dlq/ lane and to the DLQ topic, next to a small one, and the offsets commit."""

    import thalweg_client

    topic, dlq_topic = topic_factory(1), topic_factory(1, prefix="dlq")
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    big_producer = Producer(
        {"bootstrap.servers": bootstrap, "message.max.bytes": 8 << 20, "log_level": 2}
    )
    big = b"{" + b"x" * (2 << 20)
    for value in (b'{"i": 0}', big, b"{small", b'{"i": 3}'):
        big_producer.produce(topic, value, partition=0)
    big_producer.flush(10)
    gw = gateway_factory([topic], dlq_topic=dlq_topic)
    gw.wait_durable(topic, {0: 4})
    assert gw.committed(topic, 0, 4) == 4
    with thalweg_client.connect(gw.flight_url) as client:
        dlq = client.read(topic, lane="dlq")
    assert sorted(dlq["_twg_source_value"].to_pylist(), key=len) == [b"{small", big]
    got = consume_confluent(bootstrap, dlq_topic, 2, timeout=15, fetch_max_bytes=16 << 20)
    assert sorted((m.value for m in got), key=len) == [b"{small", big]


def test_a_dlq_topic_that_stays_unreachable_is_given_up_after_its_bound(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    """The DLQ topic's cluster does not answer (a closed loopback port): with
    dlq_topic_max_wait_s the letters stay in the durable dlq/ lane, the give-up is
    counted, and the offsets are committed after the bound instead of never."""
    import socket
    import time

    import thalweg_client

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    topic = topic_factory(1)
    for value in (b'{"i": 0}', b"{broken", b'{"i": 2}'):
        producer.produce(topic, value, partition=0)
    producer.flush(10)
    started = time.monotonic()
    gw = gateway_factory(
        [topic],
        dlq_topic="dead-letters",
        dlq_bootstrap_servers=f"127.0.0.1:{dead_port}",
        dlq_topic_max_wait_s=2.0,
    )
    gw.wait_durable(topic, {0: 3})
    assert gw.committed(topic, 0, 3, timeout=30) == 3
    assert time.monotonic() - started >= 2.0, "committed before the DLQ bound passed"
    with thalweg_client.connect(gw.flight_url) as client:
        dlq = client.read(topic, lane="dlq")
    assert dlq["_twg_source_value"].to_pylist() == [b"{broken"]
    metrics = gw.gateway.metrics.exposition().decode()
    assert 'twg_retries_exhausted_total{stage="dlq"} 1.0' in metrics
    assert 'twg_retries_total{stage="dlq"}' in metrics
