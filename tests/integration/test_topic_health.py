"""/health says what a source consumes: a configured topic the broker does not have
is named and turns /ready 503, and a member holding no partition because the group's
other member holds them all is healthy and says so."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import RunningGateway
from tests.helpers import produce_json, wait_until

pytestmark = pytest.mark.integration


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return int(e.code), json.loads(e.read())


def test_a_topic_the_broker_will_not_have_is_named_and_fails_readiness(
    gateway_factory: Callable[..., RunningGateway], topic_factory: Callable[..., str]
) -> None:
    """Both test brokers create a subscribed topic on first use, as Kafka does by
    default; a name the broker cannot create stands for a cluster with auto-creation
    off. aiokafka waits ``request_timeout_ms`` for it at start, then the source says
    which topic is missing, /ready is 503, and it keeps retrying."""
    present = topic_factory()
    missing = "no such topic!"
    gw = gateway_factory([present, missing], request_timeout_ms=2000)

    def source_down() -> dict[str, Any] | None:
        comp = get(gw.admin_url + "/health")[1]["components"]["source:test"]
        return dict(comp) if "not on the broker" in comp["detail"] else None

    comp = wait_until(source_down, 30, "the source naming the missing topic")
    assert comp["state"] == "down"
    assert repr(missing)[1:-1] in comp["detail"] and present not in comp["detail"]
    assert get(gw.admin_url + "/ready")[0] == 503
    assert get(gw.admin_url + "/live")[0] == 200


def test_a_member_without_partitions_is_ready_and_says_why(
    gateway_factory: Callable[..., RunningGateway],
    topic_factory: Callable[..., str],
    broker: Any,
) -> None:
    topic = topic_factory(1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    produce_json(broker.bootstrap, topic, ({"i": i} for i in range(10)))
    a = gateway_factory([topic], group_id=group)
    a.wait_durable(topic, {0: 10})
    b = gateway_factory([topic], group_id=group)

    def info(gw: RunningGateway) -> dict[str, Any]:
        return dict(get(gw.admin_url + "/health")[1]["components"]["source:test"].get("info", {}))

    # After the rebalance one member holds the partition and the other none.
    def split() -> bool:
        parts = [info(a).get("partitions"), info(b).get("partitions")]
        return sorted(len(p) for p in parts if p is not None) == [0, 1] and None not in parts

    wait_until(split, 30, lambda: f"one partition between two members: {info(a)} {info(b)}")
    idle = a if not info(a)["partitions"] else b
    assert "other members hold them all" in info(idle)["assignment"]
    wait_until(lambda: get(idle.admin_url + "/ready")[0] == 200, 20, "the idle member ready")
