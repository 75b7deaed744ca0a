"""Schema bombs end to end (issue 13): one valid JSON record with 100,000 keys used to
make every later decoded segment 100,010 columns wide (ingest 1,130 → 0-60 rec/s, RSS
215 MB → 5 GB). Now it is dead-lettered as ``schema_limit`` with its offset committed,
the decoded schema stays narrow, the records after it decode at the rate the records
before it did, and a 100,000-column ``do_put`` is refused before anything is produced.

Timing and memory bounds are deliberately generous (a loaded CI machine must pass):
they catch a collapse, not a regression of a few percent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import assert_verified
from thalweg.embedded import TansuBroker

pytestmark = pytest.mark.integration

BATCH = 20_000  # normal records per phase


def _rss_mb() -> float:
    """Resident memory of this process (the gateway runs in it), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _produce(producer: Producer, topic: str, values: list[bytes]) -> None:
    for i, v in enumerate(values):
        producer.produce(topic, v, partition=0)
        if i % 2000 == 1999:
            producer.poll(0)
    assert producer.flush(30) == 0


def _normal(start: int, n: int) -> list[bytes]:
    return [
        json.dumps(
            {"id": i, "customer": f"c-{i % 977}", "amount": i * 0.5, "tags": ["a", "b"]}
        ).encode()
        for i in range(start, start + n)
    ]


def _timed_phase(
    gw: RunningGateway, producer: Producer, topic: str, values: list[bytes], end: int
) -> float:
    started = time.monotonic()
    _produce(producer, topic, values)
    gw.wait_durable(topic, {0: end}, timeout=60)
    return time.monotonic() - started


def test_a_100k_key_record_and_a_100k_column_put_leave_the_lane_as_it_was(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(1)
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "linger.ms": 5,
            "message.max.bytes": 8 << 20,
            "log_level": 2,
        }
    )
    gw = gateway_factory([topic])
    runner = gw.gateway.runners[0]

    # Warm up (the first batch makes the schema), then time BATCH normal records.
    _timed_phase(gw, producer, topic, _normal(0, 1000), 1000)
    before_s = _timed_phase(gw, producer, topic, _normal(1000, BATCH), 1000 + BATCH)
    rss_before = _rss_mb()
    width_before = len(runner.payload_schema(topic) or [])

    # The bomb (1.8 MB, valid JSON), then BATCH normal records right behind it.
    bomb = json.dumps({f"k{i:06d}": i for i in range(100_000)}).encode()
    bomb_offset = 1000 + BATCH
    end = bomb_offset + 1 + BATCH
    after_s = _timed_phase(gw, producer, topic, [bomb, *_normal(bomb_offset + 1, BATCH)], end)
    rss_after = _rss_mb()

    # The bomb is in the dead-letter lane with its reason; its offset is committed.
    with thalweg_client.connect(gw.flight_url) as client:
        dlq = client.read(topic, lane="dlq")
        later = client.read(topic, start={"offset": bomb_offset}, metadata="all")
    assert dlq.num_rows == 1
    assert dlq["_twg_dlq_reason"].to_pylist() == ["schema_limit"]
    assert dlq["_twg_dlq_stage"].to_pylist() == ["decode"]
    assert dlq["_twg_source_offset"].to_pylist() == [bomb_offset]
    assert "max_columns (1000)" in dlq["_twg_dlq_error"][0].as_py()
    assert dlq["_twg_source_value"][0].as_py() == bomb  # the letter holds the record whole
    assert gw.committed(topic, 0, end) == end

    # The decoded schema did not move; the records after the bomb decode.
    assert len(runner.payload_schema(topic) or []) == width_before == 4
    payload = [n for n in later.column_names if not n.startswith("_twg_")]
    assert payload == ["id", "customer", "amount", "tags"]
    assert later.num_rows == 1 + BATCH
    assert later["id"].to_pylist() == [None, *range(bomb_offset + 1, end)]
    assert later["_twg_decode_error"].null_count == BATCH

    # Throughput and memory did not collapse (before the fix: 0-60 rec/s, +GBs).
    print(
        f"\nschema bomb: {BATCH / before_s:,.0f} rec/s before, {BATCH / after_s:,.0f} rec/s "
        f"after (bomb included); RSS {rss_before:.0f} MB → {rss_after:.0f} MB"
    )
    assert after_s < 3 * before_s + 5
    assert rss_after - rss_before < 400

    # A 100,000-column put is refused before producing: the next record in the topic is
    # the normal put that follows it.
    wide = pa.table({f"c{i}": pa.array([1], pa.int64()) for i in range(100_000)})
    with thalweg_client.connect(gw.flight_url) as client:
        with pytest.raises(pa.ArrowInvalid, match=r"schema_limits.*max_columns \(1000\)"):
            client.write(topic, wide)
        acks = client.write(topic, pa.table({"id": [end], "customer": ["c"]}))
        assert acks[0]["rows"] == 1
        gw.wait_durable(topic, {0: end + 1})
        tail = client.read(topic, start={"offset": end}, lane="raw")
    assert tail.num_rows == 1
    assert json.loads(tail["_twg_source_value"][0].as_py()) == {"id": end, "customer": "c"}
    gw.stop()
    assert_verified(gw.gateway.cfg)  # the bomb a dead letter once, the lane whole
