"""Operator endpoints on a running gateway."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from tests.conftest import RunningGateway

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
    assert f"twg_partition_durable_offset{{{labels}}} 21.0" in metrics
    assert f"twg_partition_committed_offset{{{labels}}} 21.0" in metrics
    assert f"twg_partition_consumed_offset{{{labels}}} 21.0" in metrics
    assert f"twg_source_records_total{{{labels}}} 21.0" in metrics
    assert f'twg_decode_failures_total{{reason="syntax",topic="{topic}"}} 1.0' in metrics
    assert f'twg_raw_rows_written_total{{topic="{topic}"}} 41.0' in metrics

    gw.stop()
    # After a graceful stop nothing is ready any more, but the lane stays readable.
    assert gw.gateway.health.ready() is False
