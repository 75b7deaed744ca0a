"""The Confluent registry client against a faithful in-process registry."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

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


def test_tls_registry(tmp_path: Path) -> None:
    """https with a private CA: trusted via ssl_cafile; untrusted is a config error, not
    an outage (not retriable)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    server = FakeRegistry(tls=(str(cert), str(key)))
    try:
        sid = server.add("s", SCHEMA)
        assert server.url.startswith("https://")
        trusted = ConfluentRegistry(
            server.url, ssl_context=ssl.create_default_context(cafile=str(cert))
        )
        assert trusted.fetch(sid) == SCHEMA
        with pytest.raises(RegistryError, match="not trusted") as info:
            ConfluentRegistry(server.url, timeout_s=2).fetch(sid)
        assert not info.value.retriable
    finally:
        server.stop()


def test_encoder_for_topic_registers_under_the_topic_subject(registry: FakeRegistry) -> None:
    import pyarrow as pa

    from thalweg.codecs.avro import AvroArrowDecoder
    from thalweg.records import MetadataColumns
    from thalweg.registry.encoding import avro_encoder_for_topic

    client = ConfluentRegistry(registry.url, username="svc", password="pw")
    table = pa.table({"id": [1, 2], "name": ["a", None]})
    encoder = avro_encoder_for_topic(client, "orders.v1", table.schema)
    assert registry.subjects["orders.v1-value"] == [encoder.schema_id]
    again = avro_encoder_for_topic(client, "orders.v1", table.schema)
    assert again.schema_id == encoder.schema_id  # idempotent
    payloads = encoder.encode(table)
    decoded = AvroArrowDecoder(MetadataColumns(), client).decode(pa.array(payloads))
    assert decoded.table.to_pylist() == table.to_pylist()
