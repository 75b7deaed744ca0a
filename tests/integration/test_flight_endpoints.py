"""Endpoints that parallelise: per partition, and per slice of a large history."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from confluent_kafka import Producer

from tests.conftest import RunningGateway

pytestmark = pytest.mark.integration

PARTITIONS = 6
PER_PARTITION = 1500


@pytest.fixture
def six(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> tuple[str, RunningGateway]:
    topic = topic_factory(PARTITIONS)
    gw = gateway_factory(
        [topic],
        gateway={"flight": {"slice_rows": 500}},
    )
    # Five rounds, each made durable before the next: at least five segments apiece.
    step = PER_PARTITION // 5
    for lo in range(0, PER_PARTITION, step):
        for p in range(PARTITIONS):
            for i in range(lo, lo + step):
                producer.produce(topic, json.dumps({"p": p, "i": i}).encode(), partition=p)
        producer.flush(30)
        gw.wait_durable(topic, dict.fromkeys(range(PARTITIONS), lo + step), timeout=60)
    return topic, gw


def test_every_endpoint_in_parallel_is_exactly_the_topic(six: tuple[str, RunningGateway]) -> None:
    topic, gw = six
    client = fl.FlightClient(gw.flight_url)
    info = client.get_flight_info(fl.FlightDescriptor.for_path("topics", topic))
    metas = [json.loads(e.app_metadata) for e in info.endpoints]
    # Sliced: more endpoints than partitions, each an offset range of one partition.
    assert len(info.endpoints) > PARTITIONS
    assert {m["partition"] for m in metas} == set(range(PARTITIONS))
    for p in range(PARTITIONS):
        ranges = sorted((m["start"], m["end"]) for m in metas if m["partition"] == p)
        assert ranges[0][0] == 0
        assert ranges[-1][1] == PER_PARTITION
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), ranges
    assert info.total_records == PARTITIONS * PER_PARTITION
    assert info.total_bytes > 0
    assert sum(m["rows"] for m in metas) == info.total_records
    assert all(e.locations[0].uri.decode() == gw.flight_url for e in info.endpoints)

    def fetch(endpoint: fl.FlightEndpoint) -> pa.Table:
        return fl.FlightClient(gw.flight_url).do_get(endpoint.ticket).read_all()

    with ThreadPoolExecutor(8) as pool:
        tables = list(pool.map(fetch, info.endpoints))
    for table, meta in zip(tables, metas, strict=True):
        assert table.num_rows == meta["rows"]
    rows = pa.concat_tables(tables).select(["p", "i", "_twg_source_partition"]).to_pylist()
    got = sorted((r["p"], r["i"]) for r in rows)
    assert got == [(p, i) for p in range(PARTITIONS) for i in range(PER_PARTITION)]
    assert all(r["p"] == r["_twg_source_partition"] for r in rows)


def test_slices_of_a_bounded_read_and_unknown_totals(six: tuple[str, RunningGateway]) -> None:
    topic, gw = six
    client = fl.FlightClient(gw.flight_url)
    ticket = {"topic": topic, "partitions": [2], "start": {"offset": 150}, "end": {"offset": 1234}}
    info = client.get_flight_info(fl.FlightDescriptor.for_command(json.dumps(ticket)))
    metas = [json.loads(e.app_metadata) for e in info.endpoints]
    assert metas[0]["start"] == 150
    assert metas[-1]["end"] == 1234
    # Partial first and last segments: their counts are not exact, so no total is claimed.
    assert info.total_records == -1
    rows = pa.concat_tables(client.do_get(e.ticket).read_all() for e in info.endpoints)
    assert sorted(rows.column("i").to_pylist()) == list(range(150, 1234))
    # A follow read is one endpoint per partition, with no slices and no totals.
    follow = {"topic": topic, "end": "follow"}
    info = client.get_flight_info(fl.FlightDescriptor.for_command(json.dumps(follow)))
    assert len(info.endpoints) == PARTITIONS
    assert info.total_records == -1


def test_schema_for_every_lane_and_list_by_prefix(
    six: tuple[str, RunningGateway],
) -> None:
    topic, gw = six
    client = fl.FlightClient(gw.flight_url)
    cols = gw.gateway.columns
    for lane, must_have in (
        ("decoded", {"p", "i", cols.offset}),
        ("raw", {cols.value, cols.offset, cols.record_id}),
        ("dlq", {cols.value, cols.offset}),
    ):
        desc = fl.FlightDescriptor.for_command(json.dumps({"topic": topic, "lane": lane}))
        assert must_have <= set(client.get_schema(desc).schema.names), lane
    listed = [f.descriptor.path[1].decode() for f in client.list_flights(topic[:5].encode())]
    assert topic in listed
    assert list(client.list_flights(b"no-such-prefix-")) == []
