"""The Pulsar broker goes away and comes back: /live stays 200, /ready goes 503 and
back to 200, and every message — before, during the outage's aftermath, after — lands
in the raw lane exactly once."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import RunningGateway, pulsar_source_cfg
from tests.e2e.test_broker_outage import status
from tests.e2e.test_pulsar_crash import lane_values, produce
from tests.helpers import assert_verified, wait_until
from tests.pulsar_lite import PulsarLite

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 30) -> float:
    """Seconds until ``cond`` held (the shared wait, timed)."""
    start = time.monotonic()
    wait_until(cond, timeout, what, interval=0.1)
    return time.monotonic() - start


def test_pulsar_broker_outage(
    tmp_path: Path, gateway_factory: Callable[..., RunningGateway]
) -> None:
    broker = PulsarLite(tmp_path / "broker")  # its own: this test stops it
    try:
        topic = "outage"
        produce(broker.url, topic, 0, 1000)
        gw = gateway_factory([], sources=[pulsar_source_cfg(broker.url, [topic])])
        ready, live = gw.admin_url + "/ready", gw.admin_url + "/live"
        wait_for(lambda: status(ready) == 200, "ready")
        wait_for(lambda: len(lane_values(gw.data_dir, topic)) == 1000, "first 1000 durable")
        broker.stop()
        went_down = wait_for(lambda: status(ready) == 503, "/ready 503")
        assert status(live) == 200
        time.sleep(3)  # an outage, not a blip
        assert status(live) == 200 and status(ready) == 503
        broker = PulsarLite(tmp_path / "broker", port=broker.port)  # same storage
        wait_for(lambda: status(ready) == 200, "/ready back", timeout=60)
        produce(broker.url, topic, 1000, 1000)
        wait_for(lambda: len(lane_values(gw.data_dir, topic)) >= 2000, "all 2000", timeout=60)
        gw.stop()
        values = lane_values(gw.data_dir, topic)
        assert sorted(values) == list(range(2000))  # none lost, none twice
        assert went_down < 8, went_down  # within a few probe periods (2 s each)
        assert_verified(gw.gateway.cfg)
    finally:
        broker.stop()
