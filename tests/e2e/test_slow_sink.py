"""A slow primary sink throttles fetching: memory stays bounded while the backlog waits
in the broker, and throughput recovers when the sink speeds up."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from tests.conftest import RunningGateway
from tests.helpers import assert_verified

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOTAL = 1_000_000  # as the issue asks: a million records waiting in the broker
BOUND = 8 << 20  # raw_lane.max_buffered_bytes
FETCH = 1 << 20  # one fetch may land on top of the bound before the pause takes effect


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def test_slow_sink_bounds_memory_and_recovers(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(1)
    value = b"x" * 200
    for i in range(TOTAL):
        producer.produce(topic, value, partition=0)
        if i % 20_000 == 19_999:
            producer.flush(60)  # the client queue holds 100k messages at most
    producer.flush(60)
    gw = gateway_factory(
        [topic],
        format="none",
        raw_lane={"max_buffered_bytes": BOUND, "roll_bytes": 1 << 20, "roll_age_s": 0.2},
        fetch_max_bytes=FETCH,
        max_partition_fetch_bytes=FETCH,
    )
    disk_recovered = gw.hold_writes(each_s=2.0)  # a disk far too slow
    metrics = gw.gateway.metrics
    peak_buffered = peak_rss = 0
    paused_seen = False
    t = time.monotonic()
    time.sleep(2.0)
    base_rss = rss_bytes()  # started, connected, first fetches taken: the steady state
    while time.monotonic() - t < 10:
        peak_buffered = max(peak_buffered, int(metrics.buffered_bytes._value.get()))
        peak_rss = max(peak_rss, rss_bytes())
        paused_seen |= metrics.paused.labels("test")._value.get() == 1
        time.sleep(0.05)
    slow_durable = gw.gateway.catalog.durable_end(topic, 0)
    assert slow_durable < TOTAL / 2, "the sink was not slow enough to build a backlog"
    assert paused_seen, "fetching never paused"
    assert peak_buffered <= BOUND + FETCH + (2 << 20), peak_buffered
    # From the steady state on, memory does not grow with the ~200 MB backlog: it stays in
    # the broker.
    assert peak_rss - base_rss < 64 << 20, (peak_rss - base_rss) >> 20
    disk_recovered.set()
    t = time.monotonic()
    gw.wait_durable(topic, {0: TOTAL}, timeout=120)
    fast_s = time.monotonic() - t
    print(
        f"slow sink: {slow_durable} records durable in 10 s, peak buffered "
        f"{peak_buffered >> 10} KiB (bound {BOUND >> 10} KiB), RSS +{(peak_rss - base_rss) >> 20} "
        f"MiB; after recovery the remaining {TOTAL - slow_durable} took {fast_s:.1f}s"
    )
    assert (TOTAL - slow_durable) / fast_s > slow_durable / 10  # throughput recovered
    gw.stop()
    assert_verified(gw.gateway.cfg)
