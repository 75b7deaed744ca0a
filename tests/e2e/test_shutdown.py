"""Graceful shutdown: SIGTERM under load stops within the deadline, commits exactly the
durable coverage, and a restart continues with no gap and no duplicate; a drain that
cannot finish is abandoned at the deadline without committing anything it did not write."""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
from confluent_kafka import Producer

from tests.conftest import RunningGateway
from tests.e2e.test_crash_exactness import start_gateway, wait_started, write_config
from tests.helpers import assert_verified, committed_offsets, produce_json, wait_until
from thalweg.embedded import TansuBroker
from thalweg.errors import ShutdownTimeoutError
from thalweg.lane import LaneLayout, scan_coverage

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 3
TOTAL = 60_000
DEADLINE_S = 25.0  # the product default


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets; a partition with none as 0, the lane end of a
    partition with nothing durable — both mean "nothing yet" (seen once in CI: a stop
    landed before one partition's first fetch)."""
    offsets = committed_offsets(bootstrap, group, topic, range(PARTITIONS))
    return {p: max(o, 0) for p, o in offsets.items()}


def test_sigterm_under_load(
    broker: TansuBroker, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(PARTITIONS, prefix="term")
    group = f"term-{uuid.uuid4().hex[:8]}"
    data, config, log = tmp_path / "lane", tmp_path / "twg.toml", tmp_path / "gw.log"
    write_config(config, broker.bootstrap, topic, group, data)
    layout = LaneLayout(data)
    produced = threading.Event()

    def produce() -> None:
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "log_level": 2})
        for n in range(TOTAL):
            p.produce(topic, json.dumps({"n": n}).encode(), partition=n % PARTITIONS)
            if n % 2000 == 1999:
                p.poll(0)
                time.sleep(0.2)  # ~10k records/s, so the stop lands mid-stream
        p.flush(30)
        produced.set()

    threading.Thread(target=produce, daemon=True).start()
    proc = start_gateway(config, log)
    try:
        wait_started(proc)
        wait_until(
            lambda: (
                sum(scan_coverage(layout, topic, p).end or 0 for p in range(PARTITIONS)) >= 5000
            ),
            60,
            lambda: f"5000 durable records; gateway log: {log.read_text()[-2000:]}",
            interval=0.1,
        )
        assert not produced.is_set(), "the producer finished before the stop: not under load"
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE_S + 10) == 0, log.read_text()[-2000:]
        took = time.monotonic() - t
        assert took < DEADLINE_S
        # Everything fetched was made durable and exactly that was committed.
        ends = {p: scan_coverage(layout, topic, p).end or 0 for p in range(PARTITIONS)}
        assert committed(broker.bootstrap, group, topic) == ends
        print(f"SIGTERM under load: stopped in {took:.1f}s at {ends}")

        proc = start_gateway(config, log)  # the restart continues where the lane ends
        assert produced.wait(60)
        expected = {p: len(range(p, TOTAL, PARTITIONS)) for p in range(PARTITIONS)}

        def alive() -> None:
            assert proc.poll() is None, log.read_text()[-2000:]

        wait_until(
            lambda: {p: scan_coverage(layout, topic, p).end for p in range(PARTITIONS)} == expected,
            90,
            "the lane to catch up",
            interval=0.2,
            check=alive,
        )
        wait_started(proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE_S + 10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    lane = ds.dataset(data / "raw" / f"topic={topic}", format="parquet").to_table(
        columns=["_twg_source_partition", "_twg_source_offset"]
    )
    for p, n in expected.items():
        offsets = lane.filter(pc.equal(lane["_twg_source_partition"], p))["_twg_source_offset"]
        assert len(offsets) == n
        assert pc.count_distinct(offsets).as_py() == n  # no duplicate, and with n: no gap
    assert committed(broker.bootstrap, group, topic) == expected
    assert_verified(config)


def test_a_drain_past_the_deadline_is_abandoned_uncommitted(
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(1)
    gw = gateway_factory([topic], gateway={"shutdown_timeout_s": 1.0}, raw_lane={"roll_age_s": 60})
    release = gw.hold_writes()  # a disk that hangs
    produce_json(gw.gateway.cfg.sources[0].bootstrap_servers, topic, ({"i": i} for i in range(100)))
    wait_until(
        lambda: (gw.gateway.catalog.high_water(topic, 0) or 0) >= 100, 30, "100 records fetched"
    )
    t = time.monotonic()
    gw.stop(timeout=15)
    took = time.monotonic() - t
    release.set()
    assert took < 10
    errors = gw.expect_errors()  # the one error this test means to cause
    assert len(errors) == 1
    assert isinstance(errors[0], ShutdownTimeoutError)
    assert "gateway.shutdown_timeout_s" in str(errors[0])
    assert gw.gateway.catalog.describe(topic)["partitions"][0]["committed"] in (None, 0)
    # Nothing of the abandoned drain landed: the lane is empty and nothing was committed.
    assert_verified(gw.gateway.cfg)
