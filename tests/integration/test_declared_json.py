"""A JSON topic whose columns are fixed by a declared JSON Schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from thalweg.errors import ConfigError

pytestmark = pytest.mark.integration

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "amount": {"type": "number"},
        "placed": {"type": "string", "format": "date-time"},
    },
}


def test_declared_schema_fixes_columns(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    path = tmp_path / "orders.schema.json"
    path.write_text(json.dumps(SCHEMA))
    topic = topic_factory(1)
    producer.produce(
        topic, b'{"id": 1, "amount": 5, "placed": "2026-11-30T10:00:00Z", "x": 1}', partition=0
    )
    producer.produce(topic, b'{"id": 2.5}', partition=0)
    producer.flush(10)
    gw = gateway_factory([topic], json_schema=str(path))
    gw.wait_durable(topic, {0: 2})
    with thalweg_client.connect(gw.flight_url) as client:
        table = client.read(topic, metadata="none")
        dlq = client.read(topic, lane="dlq")
    assert table.schema.names == ["id", "amount", "placed"]
    assert table.schema.field("amount").type == pa.float64()
    assert table.schema.field("placed").type == pa.timestamp("us", tz="UTC")
    assert table["id"].to_pylist() == [1]
    assert dlq["_twg_dlq_reason"].to_pylist() == ["type_conflict"]


def test_unusable_schema_file_is_a_config_error(
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "string"}')
    with pytest.raises(ConfigError, match="json_schema"):
        gateway_factory([topic_factory(1)], json_schema=str(bad))
