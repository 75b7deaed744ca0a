"""Per-source rate limits hold ingest to the configured rate."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from tests.conftest import RunningGateway

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("limit", "n"),
    [({"max_records_per_s": 1000}, 4000), ({"max_bytes_per_s": 100_000}, 4000)],
    ids=["records", "bytes"],
)
def test_rate_limit_holds_ingest_back(
    limit: dict[str, float],
    n: int,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(1)
    for i in range(n):
        producer.produce(topic, b"%099d" % i, partition=0)  # 100 B values
    producer.flush(10)
    t = time.monotonic()
    gw = gateway_factory([topic], format="none", max_poll_records=500, **limit)
    gw.wait_durable(topic, {0: n}, timeout=60)
    took = time.monotonic() - t
    # 4000 records at 1000/s (or 400 kB at 100 kB/s), after a first second's burst: at
    # least 3 s. A lower bound only — a slow machine makes it slower, never faster.
    assert took >= 2.5, took
    waited = gw.gateway.metrics.throttled.labels("test")._value.get()
    assert waited >= 2.0, waited
