"""The broker goes away for 30 s and comes back: /live stays 200, /ready goes 503 and
recovers, and every record ends up in the raw lane exactly once."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import assert_verified, produce_json, wait_until
from tests.tcp_proxy import TcpProxy
from thalweg.embedded import TansuBroker, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OUTAGE_S = 30


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_broker_outage(gateway_factory: Callable[..., RunningGateway]) -> None:
    proxy_port = free_port()
    broker = TansuBroker(advertised_port=proxy_port).start()
    proxy = TcpProxy(proxy_port, broker.port)
    bootstrap = f"127.0.0.1:{proxy_port}"  # every client connection goes through the proxy
    topic = f"outage-{uuid.uuid4().hex[:8]}"
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
        produce_json(bootstrap, topic, ({"i": i} for i in range(100)))
        gw = gateway_factory([topic], bootstrap_servers=bootstrap)
        gw.wait_durable(topic, {0: 100}, timeout=60)
        ready, live = gw.admin_url + "/ready", gw.admin_url + "/live"
        wait_until(lambda: status(ready) == 200, 20, "/ready", interval=0.2)

        proxy.cut()
        t = time.monotonic()
        saw_503 = None
        while time.monotonic() - t < OUTAGE_S:
            assert status(live) == 200  # the process is fine; only the broker is away
            if saw_503 is None and status(ready) == 503:
                saw_503 = time.monotonic() - t
            time.sleep(0.5)
        assert saw_503 is not None, "/ready never turned 503 during the outage"
        assert saw_503 < 20, saw_503  # within two default probe periods
        assert gw.gateway.catalog.durable_end(topic, 0) == 100

        proxy.restore()
        produce_json(bootstrap, topic, ({"i": i} for i in range(100, 200)))
        gw.wait_durable(topic, {0: 200}, timeout=120)
        wait_until(lambda: status(ready) == 200, 30, "/ready to recover", interval=0.2)
        with thalweg_client.connect(gw.flight_url) as client:
            table = client.read(topic)
        assert sorted(table.column("i").to_pylist()) == list(range(200))
        print(f"/ready turned 503 {saw_503:.1f}s into a {OUTAGE_S}s outage, and recovered")
        gw.stop()
        assert_verified(gw.gateway.cfg)  # the broker is back: its checks run too
    finally:
        proxy.cut()
        broker.stop()
