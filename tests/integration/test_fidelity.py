"""Raw-lane fidelity: what was produced is what the lane and Flight give back."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.corpus.edge_records import EDGES
from tests.helpers import consume_confluent, produce_aio
from thalweg.embedded import TansuBroker
from thalweg.records import MetadataColumns
from thalweg.records.convert import records_from_batch

pytestmark = pytest.mark.integration


def produce_edges(bootstrap: str, producer: Producer, topic: str) -> None:
    for edge in EDGES:
        if edge.key is None and edge.value is None:
            producer.produce(topic, key=None, value=None, partition=0)
            producer.flush(10)
        else:
            produce_aio(bootstrap, topic, [(edge.key, edge.value, edge.headers, edge.timestamp_ms)])


def headers_of(edge_headers: list[tuple[str, bytes | None]]) -> list[dict[str, bytes | None]]:
    return [{"key": k.encode(), "value": v} for k, v in edge_headers]


def check_rows(table: pa.Table) -> None:
    rows = table.sort_by("_twg_source_offset").to_pylist()
    assert len(rows) == len(EDGES)
    for edge, row in zip(EDGES, rows, strict=True):
        assert row["_twg_source_key"] == edge.key, edge.name
        assert row["_twg_source_value"] == edge.value, edge.name
        assert row["_twg_source_headers"] == headers_of(edge.headers), edge.name
        if edge.timestamp_ms is not None:
            ts = row["_twg_source_timestamp"]
            assert int(ts.timestamp() * 1000) == edge.timestamp_ms, edge.name
        assert row["_twg_source_timestamp_type"] == "CreateTime"
        assert row["_twg_source_partition"] == 0
        assert len(row["_twg_record_id"]) == 16


def test_edge_values_survive_parquet_and_flight(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(1)
    produce_edges(broker.bootstrap, producer, topic)
    gw = gateway_factory([topic])
    gw.wait_durable(topic, {0: len(EDGES)})

    lane = ds.dataset(gw.data_dir / "raw", format="parquet", partitioning="hive").to_table(
        filter=ds.field("topic") == topic
    )
    check_rows(lane)

    with thalweg_client.connect(gw.flight_url) as client:
        raw = client.read(topic, lane="raw")
        check_rows(raw)
        # Offsets are dense and unique; record ids are unique and deterministic.
        offsets = raw.column("_twg_source_offset").to_pylist()
        assert sorted(offsets) == list(range(len(EDGES)))
        assert len(set(raw.column("_twg_record_id").to_pylist())) == len(EDGES)


def broker_view(bootstrap: str, topic: str, n: int) -> list[tuple[int, int]]:
    """(offset, timestamp) of ``n`` records as a plain confluent-kafka consumer sees them."""
    return [(r.offset, r.timestamp) for r in consume_confluent(bootstrap, topic, n)]


def test_timestamps_match_a_plain_consumer(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    """Negative, zero and ordinary CreateTimes: the lane holds what the broker returns."""
    topic = topic_factory(1)
    stamps = (-1_000, -1, 0, 1, 1_700_000_000_000, 253_402_300_799_999, 2**62)
    produce_aio(broker.bootstrap, topic, [(b"k", b"{}", [], ts) for ts in stamps])
    gw = gateway_factory([topic])
    gw.wait_durable(topic, {0: len(stamps)})
    with thalweg_client.connect(gw.flight_url) as client:
        raw = client.read(topic, lane="raw").sort_by("_twg_source_offset")
    lane = list(
        zip(
            raw.column("_twg_source_offset").to_pylist(),
            raw.column("_twg_source_timestamp").cast(pa.int64()).to_pylist(),
            strict=True,
        )
    )
    assert lane == broker_view(broker.bootstrap, topic, len(stamps))
    # The record model holds them too (no datetime overflow on the way).
    records = records_from_batch(raw, MetadataColumns())
    assert [r.timestamp.ms for r in records] == [ts for _, ts in lane]
