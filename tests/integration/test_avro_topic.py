"""An Avro topic end to end: registry, two schema versions, poison, a registry outage."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import wait_until
from tests.registry_server import FakeRegistry

pytestmark = pytest.mark.integration

V1 = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "customer", "type": "string"}],
}
V2 = {
    **V1,
    "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}
V3 = {**V2, "fields": [*V2["fields"], {"name": "qty", "type": ["null", "int"], "default": None}]}


def framed(schema_id: int, schema: dict[str, Any], rec: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), rec)
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


def test_avro_topic_with_evolution_poison_and_registry_outage(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    registry: FakeRegistry,
) -> None:
    topic = topic_factory(1)
    id1 = registry.add(f"{topic}-value", V1)
    id2 = registry.add(f"{topic}-value", V2)
    for i in range(10):
        producer.produce(topic, framed(id1, V1, {"id": i, "customer": f"c{i}"}), partition=0)
    producer.produce(topic, b"\x01not-avro", partition=0)  # wrong magic byte
    producer.produce(topic, framed(999, V1, {"id": -1, "customer": "?"}), partition=0)  # unknown id
    for i in range(10, 20):
        producer.produce(
            topic, framed(id2, V2, {"id": i, "customer": f"c{i}", "note": "n"}), partition=0
        )
    producer.flush(10)

    gw = gateway_factory([topic], format="avro", registry={"url": registry.url})
    gw.wait_durable(topic, {0: 22})
    with thalweg_client.connect(gw.flight_url) as client:
        table = client.read(topic).sort_by("_twg_source_offset")
    assert table.column_names[:3] == ["id", "customer", "note"]
    ids = table["id"].to_pylist()
    assert ids == [*range(10), None, None, *range(10, 20)]
    assert table["note"].to_pylist() == [None] * 12 + ["n"] * 10
    errors = table["_twg_decode_error"].to_pylist()
    assert errors[10].startswith("bad_framing") and errors[11].startswith("unknown_schema")
    assert all(e is None for i, e in enumerate(errors) if i not in (10, 11))

    # The registry goes down before a new schema version is first seen: its records wait.
    registry.down = True
    id3 = registry.add(f"{topic}-value", V3)
    for i in range(20, 25):
        producer.produce(
            topic, framed(id3, V3, {"id": i, "customer": "x", "note": None, "qty": i}), partition=0
        )
    producer.flush(10)
    wait_until(  # several lookups of the new schema while the registry is down
        lambda: sum(f"/schemas/ids/{id3}" in r for r in registry.requests) >= 2,
        15,
        "the gateway to retry the new schema's lookup",
    )
    assert gw.gateway.catalog.durable_end(topic, 0) == 22, (
        "records passed while the registry was down"
    )
    health = gw.gateway.health.tree()["components"]["source:test"]
    assert health["state"] == "degraded" and "503" in health["detail"]
    registry.down = False
    gw.wait_durable(topic, {0: 27})
    with thalweg_client.connect(gw.flight_url) as client:
        table = client.read(topic, start={"offset": 22}).sort_by("_twg_source_offset")
    assert table["qty"].to_pylist() == list(range(20, 25))
    assert table["_twg_decode_error"].null_count == 5
    metrics = gw.gateway.metrics.exposition().decode()
    assert 'twg_registry_errors_total{source="test"}' in metrics
