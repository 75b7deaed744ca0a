"""Differential: the same topic through aiokafka (the gateway) and confluent-kafka.

The gateway's raw lane (aiokafka, our adapter, our batch builder, Parquet, Flight) is
compared with a table built here, column by column, from what a plain confluent-kafka
consumer sees, by code that shares nothing with the product's builder: a difference means
one client, our adapter or our builder changes data.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable

import pyarrow as pa
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.corpus.edge_records import EDGES
from tests.helpers import ConfluentRecord, consume_confluent
from tests.integration.test_fidelity import produce_edges
from thalweg.embedded import TansuBroker

pytestmark = pytest.mark.integration

CLUSTER = "test"  # the source's name in the gateway fixture's config
P = "_twg_source_"
# Null on every record the gateway reads from Kafka (docs/record-metadata.md): Pulsar-only
# fields, and record-batch fields aiokafka does not expose ("always today"), though
# confluent-kafka shows the leader epoch.
NULL_FROM_KAFKA = {
    f"{P}{n}"
    for n in (
        "message_id",
        "ledger_id",
        "entry_id",
        "batch_index",
        "ordering_key",
        "publish_time",
        "event_time",
        "producer_name",
        "redelivery_count",
        "leader_epoch",
        "producer_id",
        "producer_epoch",
        "sequence",
        "is_transactional",
    )
}
# The documented Arrow types (docs/record-metadata.md) of the compared columns.
TYPES = {
    f"{P}cluster": pa.string(),
    f"{P}topic": pa.string(),
    f"{P}partition": pa.int32(),
    f"{P}offset": pa.int64(),
    f"{P}key": pa.binary(),
    f"{P}value": pa.binary(),
    f"{P}headers": pa.list_(
        pa.struct([pa.field("key", pa.binary(), nullable=False), ("value", pa.binary())])
    ),
    f"{P}timestamp": pa.timestamp("ms", tz="UTC"),
    f"{P}timestamp_type": pa.string(),
    "_twg_record_id": pa.binary(16),
    "_twg_position": pa.int64(),
}
INGEST = "_twg_ingest_ts"  # when the gateway read it: differs by nature


def record_id(topic: str, partition: int, offset: int) -> bytes:
    """The documented id (records/record_id.py): an 8-byte BLAKE2b digest of
    (cluster, topic, partition), then the big-endian offset."""
    material = b"\x00".join((CLUSTER.encode(), topic.encode(), str(partition).encode()))
    digest = hashlib.blake2b(material, digest_size=8, person=b"thalweg-rid-v1").digest()
    return digest + offset.to_bytes(8, "big", signed=True)


def expected_columns(records: list[ConfluentRecord]) -> dict[str, list[object]]:
    """What each raw-lane column must hold, derived from confluent-kafka's records."""
    return {
        f"{P}cluster": [CLUSTER for _ in records],
        f"{P}topic": [r.topic for r in records],
        f"{P}partition": [r.partition for r in records],
        f"{P}offset": [r.offset for r in records],
        f"{P}key": [r.key for r in records],
        f"{P}value": [r.value for r in records],
        f"{P}headers": [[{"key": k.encode(), "value": v} for k, v in r.headers] for r in records],
        f"{P}timestamp": [dt.datetime.fromtimestamp(r.timestamp / 1000, dt.UTC) for r in records],
        f"{P}timestamp_type": [
            "LogAppendTime" if r.timestamp_type == 1 else "CreateTime" for r in records
        ],
        "_twg_record_id": [record_id(r.topic, r.partition, r.offset) for r in records],
        "_twg_position": [r.offset for r in records],
    }


def test_aiokafka_and_confluent_kafka_lanes_agree(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(1)
    produce_edges(broker.bootstrap, producer, topic)
    gw = gateway_factory([topic], format="none")
    gw.wait_durable(topic, {0: len(EDGES)})
    with thalweg_client.connect(gw.flight_url) as client:
        lane = client.read(topic, lane="raw").sort_by("_twg_source_offset")
    records = consume_confluent(broker.bootstrap, topic, len(EDGES))
    assert len(records) == len(EDGES) == lane.num_rows

    expected = expected_columns(records)
    accounted = set(expected) | NULL_FROM_KAFKA | {INGEST}
    assert set(lane.column_names) <= accounted, set(lane.column_names) - accounted
    assert set(expected) <= set(lane.column_names), set(expected) - set(lane.column_names)
    for name, want in expected.items():
        assert lane.schema.field(name).type == TYPES[name], name
        got = lane.column(name).to_pylist()
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert a == b, f"{name}, record {i} ({EDGES[i].name}): lane {a!r} != confluent {b!r}"
    for name in NULL_FROM_KAFKA & set(lane.column_names):
        assert lane.column(name).null_count == lane.num_rows, f"{name} set on a Kafka record"
    assert lane.schema.field(INGEST).type == pa.timestamp("us", tz="UTC")
    assert lane.column(INGEST).null_count == 0
