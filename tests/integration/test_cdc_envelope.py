"""``envelope = "debezium"`` on a running gateway over tansu: Debezium events (JSON, some
with the converter's schema/payload wrapper) become rows in the decoded lane with
``__op``/``__deleted``/``__source``, tombstones are deletes, an envelope that names no row
is a dead letter with reason ``envelope``, and the raw lane keeps every event as sent."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway

pytestmark = pytest.mark.integration


def change(op: str, key: int, before: Any = None, after: Any = None) -> bytes:
    source = {"connector": "postgresql", "lsn": 1000 + key, "table": "customers"}
    body = {"before": before, "after": after, "op": op, "source": source, "ts_ms": 5}
    if key % 2:  # the JsonConverter with schemas enabled
        body = {"schema": {"type": "struct", "name": "customers.Envelope"}, "payload": body}
    if key % 4 == 1:  # as the JsonConverter writes it: the schema is cut before parsing
        return json.dumps(body, separators=(",", ":")).encode()
    return json.dumps(body).encode()


def test_debezium_events_land_as_rows_and_a_broken_one_as_a_dead_letter(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(1)
    events: list[tuple[bytes, bytes | None]] = [
        (b"1", change("r", 1, after={"id": 1, "email": "a@x"})),
        (b"2", change("c", 2, after={"id": 2, "email": "b@x"})),
        (b"1", change("u", 1, before={"id": 1, "email": "a@x"}, after={"id": 1, "email": "a@y"})),
        (b"2", change("d", 2, before={"id": 2, "email": "b@x"})),
        (b"2", None),  # the tombstone after a delete
        (b"3", json.dumps({"after": {"id": 3}}).encode()),  # no op
        (b"4", change("t", 4)),  # a truncate
    ]
    for key, value in events:
        producer.produce(topic, value, key=key, partition=0)
    producer.flush(10)
    gw = gateway_factory([topic], envelope="debezium")
    gw.wait_durable(topic, {0: len(events)})
    with thalweg_client.connect(gw.flight_url) as client:
        rows = client.read(topic, metadata="none")
        dead = client.read(topic, lane="dlq")
        raw = client.read(topic, lane="raw")
    got = rows.select(["id", "email", "__op", "__deleted"]).to_pylist()
    assert got == [
        {"id": 1, "email": "a@x", "__op": "r", "__deleted": False},
        {"id": 2, "email": "b@x", "__op": "c", "__deleted": False},
        {"id": 1, "email": "a@y", "__op": "u", "__deleted": False},
        {"id": 2, "email": "b@x", "__op": "d", "__deleted": True},
        {"id": None, "email": None, "__op": "d", "__deleted": True},
    ]
    assert [s["lsn"] for s in rows["__source"].to_pylist()[:4]] == [1001, 1002, 1001, 1002]
    assert dead["_twg_dlq_reason"].to_pylist() == ["envelope", "envelope"]
    assert dead["_twg_source_key"].to_pylist() == [b"3", b"4"]
    assert raw["_twg_source_value"].to_pylist() == [v for _, v in events]  # as sent
