"""Data contracts and bounded registry retries end to end: refused records reach the
dead-letter lane with their reason and stage, the good ones the decoded lane, and every
offset is committed only once its record is durably somewhere."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.integration.test_avro_topic import V1, framed
from tests.registry_server import FakeRegistry

pytestmark = pytest.mark.integration


def contract_file(tmp_path: Path, topic: str) -> Path:
    path = tmp_path / "orders.odcs.yaml"
    doc = {
        "apiVersion": "v3.0.2",
        "kind": "DataContract",
        "id": "orders",
        "version": "1.0.0",
        "schema": [
            {
                "name": "orders",
                "physicalName": topic,
                "properties": [
                    {"name": "id", "logicalType": "integer", "required": True},
                    {
                        "name": "amount",
                        "logicalType": "number",
                        "logicalTypeOptions": {"minimum": 0},
                    },
                    {
                        "name": "status",
                        "logicalType": "string",
                        "quality": [
                            {
                                "type": "library",
                                "metric": "invalidValues",
                                "arguments": {"validValues": ["new", "paid"]},
                                "mustBe": 0,
                            }
                        ],
                    },
                ],
                "quality": [{"type": "sql", "query": "SELECT COUNT(*) FROM orders"}],
            }
        ],
    }
    path.write_text(yaml.safe_dump(doc), "utf-8")
    return path


def test_records_breaking_the_contract_are_dead_lettered_and_committed(
    tmp_path: Path,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(2)
    expected: dict[int, tuple[str, str]] = {}  # id → (reason, partition-independent key)
    for i in range(400):
        rec: dict[str, object] = {"id": i, "amount": 1.5, "status": "new"}
        if i % 40 == 1:
            rec["amount"] = -2.0
            expected[i] = ("contract", "amount = -2.0 is below the minimum 0")
        elif i % 40 == 2:
            rec["status"] = "lost"
            expected[i] = ("quality", "status = 'lost' is not one of ['new', 'paid']")
        elif i % 40 == 3:
            del rec["id"]
            expected[i] = ("contract", "id is required")
        producer.produce(topic, json.dumps(rec).encode(), key=b"%d" % i, partition=i % 2)
    producer.flush(10)

    gw = gateway_factory([topic], contract=str(contract_file(tmp_path, topic)))
    gw.wait_durable(topic, {0: 200, 1: 200})
    with thalweg_client.connect(gw.flight_url) as client:
        dlq = client.read(topic, lane="dlq")
        decoded = client.read(topic, metadata="all")

    assert dlq.num_rows == len(expected) == 30
    by_key = {
        int(k): (r, e, s)
        for k, r, e, s in zip(
            dlq["_twg_source_key"].to_pylist(),
            dlq["_twg_dlq_reason"].to_pylist(),
            dlq["_twg_dlq_error"].to_pylist(),
            dlq["_twg_dlq_stage"].to_pylist(),
            strict=True,
        )
    }
    assert set(by_key) == set(expected)
    for i, (reason, error, stage) in by_key.items():
        assert (reason, stage) == (expected[i][0], "contract")
        assert expected[i][1] in error
    # The decoded lane: every record, the refused ones null with the reason.
    assert decoded.num_rows == 400
    good = [i for i in decoded["id"].to_pylist() if i is not None]
    assert sorted(good) == [i for i in range(400) if i not in expected]
    errors = [e for e in decoded["_twg_decode_error"].to_pylist() if e is not None]
    assert sorted(e.split(":")[0] for e in errors) == sorted(r for r, _ in expected.values())
    # Committed only past durable records: the group's offsets are the lane's coverage.
    for p in (0, 1):
        assert gw.committed(topic, p, 200) == 200
    metrics = gw.gateway.metrics.exposition().decode()
    assert f'twg_decode_failures_total{{reason="quality",topic="{topic}"}} 10.0' in metrics
    assert f'twg_decode_failures_total{{reason="contract",topic="{topic}"}} 20.0' in metrics
    # The reads were served from segments kept in memory as they were written.
    hits = re.search(r'twg_segment_cache_requests_total\{result="hit"\} (\d+)', metrics)
    assert hits is not None and int(hits.group(1)) >= 2
    assert re.search(r"twg_segment_cache_bytes [1-9]", metrics)


def test_an_unreachable_registry_past_its_bound_dead_letters_retry_exhausted(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    registry: FakeRegistry,
) -> None:
    topic = topic_factory(1)
    id1 = registry.add(f"{topic}-value", V1)
    registry.down = True
    for i in range(5):
        producer.produce(topic, framed(id1, V1, {"id": i, "customer": "c"}), partition=0)
    producer.flush(10)
    gw = gateway_factory(
        [topic], format="avro", registry={"url": registry.url}, registry_max_wait_s=1.0
    )
    started = time.monotonic()
    gw.wait_durable(topic, {0: 5})
    assert time.monotonic() - started >= 1.0, "gave up before the bound"
    with thalweg_client.connect(gw.flight_url) as client:
        dlq = client.read(topic, lane="dlq")
    assert dlq["_twg_dlq_reason"].to_pylist() == ["retry_exhausted"] * 5
    assert dlq["_twg_dlq_stage"].to_pylist() == ["decode"] * 5
    assert f"schema id {id1}: the schema registry was unreachable for over 1s" in (
        dlq["_twg_dlq_error"][0].as_py()
    )
    assert gw.committed(topic, 0, 5) == 5
    assert gw.gateway.health.tree()["components"]["source:test"]["state"] == "degraded"

    # It answers again: the next records decode (the id was not remembered as unknown).
    registry.down = False
    for i in range(5, 8):
        producer.produce(topic, framed(id1, V1, {"id": i, "customer": "c"}), partition=0)
    producer.flush(10)
    gw.wait_durable(topic, {0: 8})
    with thalweg_client.connect(gw.flight_url) as client:
        later = client.read(topic, start={"offset": 5})
    assert later["id"].to_pylist() == [5, 6, 7]
    assert later["_twg_decode_error"].null_count == 3
    assert gw.gateway.health.tree()["components"]["source:test"]["state"] == "up"
    metrics = gw.gateway.metrics.exposition().decode()
    assert 'twg_retries_exhausted_total{stage="registry"}' in metrics
