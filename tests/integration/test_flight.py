"""Flight reads against a live gateway: history, follow, endpoints and errors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.flight as fl
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import wait_until
from thalweg_client.wire import encode_ticket

pytestmark = pytest.mark.integration


def produce_json(producer: Producer, topic: str, partitions: int, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        doc = {"id": i, "name": f"n{i}", "price": i * 0.5, "tags": ["a", "b"][: i % 3]}
        producer.produce(
            topic, json.dumps(doc).encode(), key=str(i).encode(), partition=i % partitions
        )
    producer.flush(10)


def per_partition(n: int, partitions: int, start: int = 0) -> dict[int, int]:
    counts = dict.fromkeys(range(partitions), 0)
    for i in range(start, start + n):
        counts[i % partitions] += 1
    return counts


@pytest.fixture
def loaded(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> tuple[str, RunningGateway]:
    topic = topic_factory(3)
    produce_json(producer, topic, 3, 300)
    gw = gateway_factory([topic])
    gw.wait_durable(topic, per_partition(300, 3))
    return topic, gw


def test_do_get_matches_the_parquet_lane(loaded: tuple[str, RunningGateway]) -> None:
    topic, gw = loaded
    lane = ds.dataset(gw.data_dir / "raw", format="parquet", partitioning="hive").to_table(
        filter=ds.field("topic") == topic
    )
    with thalweg_client.connect(gw.flight_url) as client:
        raw = client.read(topic, lane="raw")
    key = [("_twg_source_partition", "ascending"), ("_twg_source_offset", "ascending")]
    assert raw.num_rows == lane.num_rows == 300
    assert raw.sort_by(key).equals(lane.select(raw.column_names).sort_by(key).cast(raw.schema))


def test_decoded_lane_has_payload_and_locator(loaded: tuple[str, RunningGateway]) -> None:
    topic, gw = loaded
    with thalweg_client.connect(gw.flight_url) as client:
        table = client.read(topic)
        assert client.topics() == sorted(client.topics()) and topic in client.topics()
        none = client.read(topic, metadata="none")
        full = client.read(topic, metadata="all", partitions=[1])
    assert table.num_rows == 300
    assert sorted(table.column("id").to_pylist()) == list(range(300))
    for name in (
        "_twg_source_topic",
        "_twg_source_partition",
        "_twg_source_offset",
        "_twg_record_id",
        "_twg_decode_error",
    ):
        assert name in table.column_names
    assert table.column("_twg_decode_error").null_count == 300
    assert [n for n in none.column_names if n.startswith("_twg_")] == []
    assert full.num_rows == 100 and "_twg_source_headers" in full.column_names
    assert "_twg_emit_ts" in full.column_names
    # Row alignment across the two stored lanes: payload id matches the raw key.
    keys = [int(k) for k in full.column("_twg_source_key").to_pylist()]
    assert keys == full.column("id").to_pylist()


def test_flight_info_has_one_endpoint_per_partition(loaded: tuple[str, RunningGateway]) -> None:
    topic, gw = loaded
    client = fl.FlightClient(gw.flight_url)
    info = client.get_flight_info(fl.FlightDescriptor.for_path("topics", topic))
    assert len(info.endpoints) == 3
    assert info.total_records == 300
    seen = []
    for ep in info.endpoints:
        ticket = json.loads(ep.ticket.ticket)
        assert len(ticket["partitions"]) == 1
        assert ep.locations[0].uri.decode() == gw.flight_url
        seen.append(client.do_get(ep.ticket).read_all().num_rows)
    assert sorted(seen) == [100, 100, 100]
    schema = client.get_schema(fl.FlightDescriptor.for_path("topics", topic)).schema
    assert schema.field("id").type == pa.int64()


def test_offset_and_timestamp_bounds(loaded: tuple[str, RunningGateway]) -> None:
    topic, gw = loaded
    with thalweg_client.connect(gw.flight_url) as client:
        part = client.read(topic, partitions=[0], start={"offset": 10}, end={"offset": 20})
        assert part.column("_twg_source_offset").to_pylist() == list(range(10, 20))
        latest = client.read(topic, start="latest")
        assert latest.num_rows == 0
        future = client.read(topic, start={"timestamp_ms": int(time.time() * 1000) + 3_600_000})
        assert future.num_rows == 0
        past = client.read(topic, start={"timestamp_ms": 0})
        assert past.num_rows == 300


def test_end_now_terminates_and_follow_sees_new_records(
    loaded: tuple[str, RunningGateway], producer: Producer
) -> None:
    topic, gw = loaded
    client = thalweg_client.connect(gw.flight_url)
    # end=now: bounded by what was durable when the call began; the stream ends.
    assert client.stream(topic).read_all().num_rows == 300

    reader = client.stream(topic, end="follow", partitions=[0, 1, 2])
    got: list[int] = []
    done = threading.Event()

    def consume() -> None:
        for batch in reader:
            got.extend(batch.column("id").to_pylist())
            if len(got) >= 360:
                done.set()
                return

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    # The stream has started (and reached the live tail) once it delivered the history.
    wait_until(lambda: len(got) >= 300, 30, "the follow stream's history")
    produce_json(producer, topic, 3, 60, start=300)
    assert done.wait(30), f"follow delivered {len(got)} of 360"
    # No gap and no duplicate across the history/live seam.
    assert sorted(got) == list(range(360))
    active = gw.gateway.metrics.flight_active_streams
    assert active._value.get() == 1
    client.close()  # cancels the follow stream
    wait_until(lambda: active._value.get() == 0, 10, "the cancelled follow stream to end")


def test_a_follow_stream_started_while_a_segment_is_written_misses_nothing(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    """The history/live seam while a write is in flight: records fetched but not yet
    durable come from the live tail (never skipped because a segment is on its way), and
    once the segment lands they are not sent again from Parquet."""
    topic = topic_factory(1)
    gw = gateway_factory([topic])
    held = gw.hold_writes()  # a slow disk: the first raw-lane write waits for us
    try:
        produce_json(producer, topic, 1, 100)
        assert held.entered.wait(30), "no raw-lane write started"
        wait_until(
            lambda: gw.gateway.catalog.high_water(topic, 0) >= 100, 30, "100 records fetched"
        )
        client = thalweg_client.connect(gw.flight_url)
        reader = client.stream(topic, end="follow", partitions=[0])
        got: list[int] = []

        def consume() -> None:
            for batch in reader:
                got.extend(batch.column("id").to_pylist())
                if 149 in got:
                    return

        threading.Thread(target=consume, daemon=True).start()
        try:
            wait_until(
                lambda: len(got) >= 100,
                15,
                "the follow stream to deliver the 100 fetched records while their segment "
                "is being written",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: got {len(got)} of 100") from None
        assert got == list(range(100))
    finally:
        held.set()
    gw.wait_durable(topic, {0: 100})
    produce_json(producer, topic, 1, 50, start=100)
    wait_until(lambda: 149 in got, 30, "the records after the seam")
    assert got == list(range(150)), "a gap or a duplicate at the history/live seam"
    client.close()


def test_bad_tickets_get_clear_errors(loaded: tuple[str, RunningGateway]) -> None:
    topic, gw = loaded
    client = fl.FlightClient(gw.flight_url)
    cases = {
        b"not json": "neither a JSON object nor a protobuf",
        b"[1,2]": "neither a JSON object nor a protobuf",
        b"{oops": "not a JSON object",
        encode_ticket({"topic": topic}) + b"\x98\x06\x01": "unknown field number(s) [99]",
        encode_ticket({"topic": "nope"}): "unknown topic 'nope'",
        json.dumps({"topic": "nope"}).encode(): "unknown topic 'nope'",
        json.dumps({"topic": topic, "lane": "cooked"}).encode(): "lane",
        json.dumps({"topic": topic, "start": "yesterday"}).encode(): "start",
        json.dumps({"topic": topic, "partitions": [9]}).encode(): "no partition 9",
        json.dumps({"topic": topic, "colour": "blue"}).encode(): "colour",
        json.dumps({"topic": topic, "v": 2}).encode(): "version",
    }
    for body, needle in cases.items():
        # ArrowInvalid is how pyarrow.flight surfaces gRPC INVALID_ARGUMENT.
        with pytest.raises(pa.ArrowInvalid) as info:
            client.do_get(fl.Ticket(body)).read_all()
        message = str(info.value).split(". Detail:")[0]
        assert needle in message, (body, message)
    # The server is still serving after all that, in both ticket forms.
    assert (
        client.do_get(fl.Ticket(json.dumps({"topic": topic}).encode())).read_all().num_rows == 300
    )
    binary = client.do_get(fl.Ticket(encode_ticket({"topic": topic, "partitions": [0]})))
    assert binary.read_all().num_rows == gw.gateway.catalog.durable_end(topic, 0)


def test_readme_pandas_and_duckdb_usage(loaded: tuple[str, RunningGateway]) -> None:
    """What the README shows: a topic read through the client into pandas and DuckDB."""
    import duckdb

    topic, gw = loaded
    with thalweg_client.connect(gw.flight_url) as client:
        orders = client.read(topic)
    df = orders.to_pandas()
    assert len(df) == 300 and df["id"].sum() == sum(range(300))
    rel = duckdb.sql("select count(*), sum(price) from orders where _twg_decode_error is null")
    assert rel.fetchall() == [(300, sum(i * 0.5 for i in range(300)))]


def test_projection_and_filters(loaded: tuple[str, RunningGateway], producer: Producer) -> None:
    topic, gw = loaded
    with thalweg_client.connect(gw.flight_url) as client:
        cols = ["id", "_twg_source_offset"]
        some = client.read(topic, columns=cols, filter=[{"column": "id", "op": ">=", "value": 290}])
        assert some.column_names == cols
        assert sorted(some["id"].to_pylist()) == list(range(290, 300))
        both = client.read(
            topic,
            filter=[
                {"column": "price", "op": "<", "value": 2.0},
                {"column": "name", "op": "in", "value": ["n1", "n2", "n9"]},
            ],
        )
        assert sorted(both["id"].to_pylist()) == [1, 2]
        # metadata=all: filter on a raw-only column, rows stay aligned with their payload.
        keyed = client.read(
            topic,
            metadata="all",
            filter=[{"column": "_twg_source_key", "op": "==", "value": "42"}],
        )
        assert keyed["id"].to_pylist() == [42]
        raw = client.read(
            topic,
            lane="raw",
            columns=["_twg_source_value"],
            filter=[{"column": "_twg_source_partition", "op": "==", "value": 1}],
        )
        assert raw.column_names == ["_twg_source_value"] and raw.num_rows == 100
        schema = client.schema(topic, columns=["name", "id"])
        assert schema.names == ["name", "id"]
        for bad, needle in (
            ({"columns": ["nope"]}, "'nope'"),
            ({"filter": [{"column": "nope", "op": "==", "value": 1}]}, "'nope'"),
            ({"filter": [{"column": "id", "op": "==", "value": "x"}]}, "does not fit"),
            ({"filter": [{"column": "id", "op": "like", "value": 1}]}, "filter"),
        ):
            with pytest.raises(pa.ArrowInvalid, match=needle):
                client.read(topic, **bad)

        # A filtered follow applies the filter to live rows too.
        reader = client.stream(
            topic, end="follow", filter=[{"column": "id", "op": ">=", "value": 305}]
        )
        produce_json(producer, topic, 3, 10, start=300)
        got: list[int] = []
        for batch in reader:
            got.extend(batch.column("id").to_pylist())
            if len(got) >= 5:
                break
        assert sorted(got) == [305, 306, 307, 308, 309]
