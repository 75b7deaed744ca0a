"""The Confluent registry client against a faithful in-process registry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.registry_server import FakeRegistry
from thalweg.registry import ConfluentRegistry, RegistryError, RegistryUnavailableError

SCHEMA = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    r = FakeRegistry(username="svc", password="pw")
    yield r
    r.stop()


def test_fetch_caches_and_404_is_none(registry: FakeRegistry) -> None:
    sid = registry.add("orders-value", SCHEMA)
    client = ConfluentRegistry(registry.url, username="svc", password="pw")
    assert client.get(sid) is None  # nothing fetched yet, no I/O
    assert client.fetch(sid) == SCHEMA
    assert client.fetch(sid) == SCHEMA
    assert client.get(sid) == SCHEMA
    assert registry.requests.count(f"GET /schemas/ids/{sid}") == 1
    assert client.fetch(999) is None


def test_register_and_latest(registry: FakeRegistry) -> None:
    client = ConfluentRegistry(registry.url, username="svc", password="pw")
    sid = client.register("t-value", SCHEMA)
    assert client.register("t-value", SCHEMA) == sid
    assert client.latest("t-value") == (sid, SCHEMA)
    assert client.latest("nope") is None


def test_auth_headers(registry: FakeRegistry) -> None:
    sid = registry.add("s", SCHEMA)
    with pytest.raises(RegistryError, match="401") as info:
        ConfluentRegistry(registry.url, username="svc", password="wrong").fetch(sid)
    assert not info.value.retriable
    bearer = FakeRegistry(token="t0k")
    try:
        bid = bearer.add("s", SCHEMA)
        assert ConfluentRegistry(bearer.url, token="t0k").fetch(bid) == SCHEMA
        with pytest.raises(RegistryError, match="401"):
            ConfluentRegistry(bearer.url, token="other").fetch(bid)
    finally:
        bearer.stop()


def test_5xx_and_refused_are_retriable(registry: FakeRegistry) -> None:
    sid = registry.add("s", SCHEMA)
    client = ConfluentRegistry(registry.url, username="svc", password="pw", timeout_s=2)
    registry.down = True
    with pytest.raises(RegistryUnavailableError, match="503") as info:
        client.fetch(sid)
    assert info.value.retriable
    registry.down = False
    assert client.fetch(sid) == SCHEMA
    registry.stop()
    with pytest.raises(RegistryUnavailableError, match="unreachable"):
        ConfluentRegistry(registry.url, timeout_s=2).fetch(sid)
