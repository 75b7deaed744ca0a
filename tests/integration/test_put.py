"""do_put into topics, and the operator actions."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer import fetcher
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.registry_server import FakeRegistry
from thalweg.embedded import TansuBroker
from thalweg.kafka import wire

pytestmark = pytest.mark.integration


def test_put_values_with_keys_headers_timestamps(
    topic_factory: Callable[..., str], gateway_factory: Callable[..., RunningGateway]
) -> None:
    topic = topic_factory(2)
    gw = gateway_factory([topic], format="none")
    stamps = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i) for i in range(6)]
    table = pa.table({"value": [b"v%d" % i for i in range(5)] + [b""]})
    with thalweg_client.connect(gw.flight_url) as client:
        acks = client.write(
            topic,
            table,
            key=[b"k0", None, b"", b"k3", b"k4", b"k5"],
            headers=[[{"key": b"h", "value": b"1"}, {"key": b"h", "value": None}]] + [[]] * 5,
            partition=[0, 1, 0, 1, 0, 1],
            timestamp=pa.array(stamps, pa.timestamp("ms", tz="UTC")),
        )
        assert acks == [{"rows": 6, "partitions": {"0": [0, 2], "1": [0, 2]}}]
        gw.wait_durable(topic, {0: 3, 1: 3})
        raw = client.read(topic, lane="raw").sort_by(
            [("_twg_source_partition", "ascending"), ("_twg_source_offset", "ascending")]
        )
        described = client.describe(topic)
    got = raw.to_pylist()
    assert [r["_twg_source_value"] for r in got] == [b"v0", b"v2", b"v4", b"v1", b"v3", b""]
    assert [r["_twg_source_key"] for r in got] == [b"k0", b"", b"k4", None, b"k3", b"k5"]
    assert got[0]["_twg_source_headers"] == [
        {"key": b"h", "value": b"1"},
        {"key": b"h", "value": None},
    ]
    assert got[0]["_twg_source_timestamp"] == stamps[0]
    parts = {p["partition"]: p for p in described["partitions"]}
    assert parts[0]["durable"] == 3 and parts[0]["committed"] == 3 and parts[0]["earliest"] == 0


def test_put_payload_columns_encoded_as_json(
    topic_factory: Callable[..., str], gateway_factory: Callable[..., RunningGateway]
) -> None:
    topic = topic_factory(1)
    gw = gateway_factory([topic])
    rows = pa.table({"id": [1, 2, 3], "name": ["a", None, "c"]})
    with thalweg_client.connect(gw.flight_url) as client:
        assert client.write(topic, rows)[0]["rows"] == 3
        gw.wait_durable(topic, {0: 3})
        back = client.read(topic, metadata="none")
    assert back.select(["id", "name"]).to_pylist() == rows.to_pylist()


def test_put_payload_columns_encoded_as_avro(
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    registry: FakeRegistry,
) -> None:
    topic = topic_factory(1)
    gw = gateway_factory([topic], format="avro", registry={"url": registry.url})
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "amount": pa.array([1.5, None])})
    with thalweg_client.connect(gw.flight_url) as client:
        client.write(topic, rows)
        gw.wait_durable(topic, {0: 2})
        back = client.read(topic, metadata="none")
    assert registry.subjects[f"{topic}-value"] == [1]
    assert back.to_pylist() == rows.to_pylist()


def test_an_avro_put_of_a_type_avro_cannot_hold_is_refused_as_invalid(
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    registry: FakeRegistry,
) -> None:
    """The type map's refusal is a ThalwegError, so the caller is told INVALID_ARGUMENT
    and why, not INTERNAL with an incident id; nothing is registered or produced."""
    topic = topic_factory(1)
    gw = gateway_factory([topic], format="avro", registry={"url": registry.url})
    rows = pa.table({"id": pa.array([1], pa.int64()), "wait": pa.array([5], pa.duration("s"))})
    client = fl.FlightClient(gw.flight_url)

    def put() -> None:
        writer, _ = client.do_put(fl.FlightDescriptor.for_path("topics", topic), rows.schema)
        writer.write_table(rows)
        writer.close()

    with pytest.raises(pa.ArrowInvalid, match=r"no Avro type for Arrow duration\[s\]"):
        put()
    assert f"{topic}-value" not in registry.subjects
    with thalweg_client.connect(gw.flight_url) as c:
        assert all(p["latest"] == 0 for p in c.describe(topic)["partitions"])


def test_bad_puts_are_refused_before_anything_is_produced(
    topic_factory: Callable[..., str], gateway_factory: Callable[..., RunningGateway]
) -> None:
    topic = topic_factory(1)
    gw = gateway_factory([topic], format="none")
    client = fl.FlightClient(gw.flight_url)
    cases = [
        (["topics", "nope"], pa.table({"value": [b"x"]}), "not configured"),
        (["topics", topic], pa.table({"value": [1]}), "must be binary or string"),
        (["topics", topic], pa.table({"value": [b"x"], "colour": ["red"]}), "'colour'"),
        (["topics", topic], pa.table({"value": [b"x"], "partition": ["a"]}), "'partition'"),
        (["topics", topic], pa.table({"id": [1]}), "'value' column"),
        (["nodes", topic], pa.table({"value": [b"x"]}), "unknown descriptor path"),
    ]

    def put(path: list[str], table: pa.Table) -> None:
        writer, _ = client.do_put(fl.FlightDescriptor.for_path(*path), table.schema)
        writer.write_table(table)
        writer.close()

    for path, table, needle in cases:
        with pytest.raises(pa.ArrowInvalid, match=needle):
            put(path, table)
    with thalweg_client.connect(gw.flight_url) as c:
        parts = c.describe(topic)["partitions"]
    assert all(p["latest"] == 0 for p in parts), "something was produced"


def test_actions(
    topic_factory: Callable[..., str], gateway_factory: Callable[..., RunningGateway]
) -> None:
    topic = topic_factory(1)
    gw = gateway_factory([topic])
    client = fl.FlightClient(gw.flight_url)
    names = {a.type for a in client.list_actions()}
    assert names == {
        "describe-topic",
        "health",
        "CreatePreparedStatement",
        "ClosePreparedStatement",
    }
    health = json.loads(next(iter(client.do_action(fl.Action("health", b"")))).body.to_pybytes())
    assert "raw_lane" in health["components"]
    with pytest.raises(pa.ArrowInvalid, match="unknown action"):
        list(client.do_action(fl.Action("reboot", b"")))
    with pytest.raises(pa.ArrowInvalid, match="unknown topic"):
        list(client.do_action(fl.Action("describe-topic", b'{"topic": "nope"}')))


def test_put_acks_are_the_broker_offsets_of_each_batch(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    """Each batch's ack names the offsets the broker gave its rows, not their places in
    the batch: partition 0 already holds records, and later batches continue where the
    earlier ones ended; reading the acked ranges back gives exactly the batch's rows."""
    topic = topic_factory(2)
    for i in range(7):
        producer.produce(topic, b"old%d" % i, partition=0)
    producer.flush(10)
    gw = gateway_factory([topic], format="none")
    parts = [0, 1, 0, 1, 0]
    batches = [
        pa.record_batch(
            {
                "value": [b"b%d-r%d" % (b, r) for r in range(len(parts))],
                "partition": pa.array(parts, pa.int32()),
            }
        )
        for b in range(3)
    ]
    with thalweg_client.connect(gw.flight_url) as client:
        acks = client.write(topic, pa.Table.from_batches(batches))
        assert acks == [
            {"rows": 5, "partitions": {"0": [7, 9], "1": [0, 1]}},
            {"rows": 5, "partitions": {"0": [10, 12], "1": [2, 3]}},
            {"rows": 5, "partitions": {"0": [13, 15], "1": [4, 5]}},
        ]
        gw.wait_durable(topic, {0: 16, 1: 6})
        for b, ack in enumerate(acks):
            for p, (first, last) in ack["partitions"].items():
                back = client.read(
                    topic,
                    lane="raw",
                    partitions=[int(p)],
                    start={"offset": first},
                    end={"offset": last + 1},
                )
                sent = [b"b%d-r%d" % (b, r) for r, q in enumerate(parts) if q == int(p)]
                assert back.column("_twg_source_value").to_pylist() == sent, (b, p)


def test_a_caller_that_waits_for_each_ack_before_sending_more_is_served(
    topic_factory: Callable[..., str], gateway_factory: Callable[..., RunningGateway]
) -> None:
    """The gateway produces one batch while reading the next, but a plain pyarrow caller
    that sends a batch only after the last one's acknowledgement must not wait on it:
    acknowledgements are written while the next read is pending."""
    topic = topic_factory(1)
    gw = gateway_factory([topic], format="none")
    schema = pa.schema([("value", pa.binary())])
    flight = fl.connect(gw.flight_url)
    writer, reader = flight.do_put(fl.FlightDescriptor.for_path("topics", topic), schema)
    acks = []
    for b in range(4):
        writer.write_batch(pa.record_batch({"value": [b"b%d-%d" % (b, i) for i in range(3)]}))
        acks.append(json.loads(reader.read().to_pybytes()))  # blocks until the ack comes
    writer.done_writing()
    writer.close()
    assert [a["partitions"] for a in acks] == [{"0": [3 * b, 3 * b + 2]} for b in range(4)]


def test_records_without_keys_spread_over_partitions_and_keyed_ones_follow_the_key(
    topic_factory: Callable[..., str], gateway_factory: Callable[..., RunningGateway]
) -> None:
    topic = topic_factory(3)
    gw = gateway_factory([topic], format="none")
    n = 3000
    with thalweg_client.connect(gw.flight_url) as client:
        (keyless,) = client.write(topic, pa.table({"value": [b"v%d" % i for i in range(n)]}))
        keys = [b"customer-%d" % (i % 7) for i in range(n)]
        (keyed,) = client.write(topic, pa.table({"value": [b"k"] * n}), key=keys)
        gw.wait_durable(
            topic,
            {
                int(p): max(
                    r[1] for a in (keyless, keyed) for q, r in a["partitions"].items() if q == p
                )
                + 1
                for p in {*keyless["partitions"], *keyed["partitions"]}
            },
        )
        raw = client.read(topic, lane="raw")
    assert set(keyless["partitions"]) == {"0", "1", "2"}  # every partition takes a share
    got = raw.filter(pa.compute.equal(raw["_twg_source_value"], b"k")).to_pylist()
    where: dict[bytes, set[int]] = {}
    for r in got:
        where.setdefault(r["_twg_source_key"], set()).add(r["_twg_source_partition"])
    assert len(got) == n and all(len(ps) == 1 for ps in where.values())


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_puts_are_produced_in_compressed_batches_when_configured(
    codec: str,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    broker: TansuBroker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``produce_compression``: the broker holds batches of that codec (seen by a plain
    aiokafka consumer's fetcher), and every row reads back as it was put."""
    topic = topic_factory(1)
    gw = gateway_factory([topic], format="none", produce_compression=codec)
    values = [json.dumps({"n": i, "text": "the same words again"}).encode() for i in range(3000)]
    with thalweg_client.connect(gw.flight_url) as client:
        client.write(
            topic, pa.table({"value": values}), key=[b"k%d" % (i % 7) for i in range(3000)]
        )
        gw.wait_durable(topic, {0: 3000})
        raw = client.read(topic, lane="raw").sort_by("_twg_source_offset")
    assert raw["_twg_source_value"].to_pylist() == values
    assert raw["_twg_source_key"].to_pylist() == [b"k%d" % (i % 7) for i in range(3000)]

    codecs: list[int] = []

    class Seen(fetcher.MemoryRecords):  # type: ignore[misc,name-defined]
        def next_batch(self, *args: Any, **kwargs: Any) -> Any:
            batch = super().next_batch(*args, **kwargs)
            if batch is not None:
                codecs.append(batch.compression_type)
            return batch

    monkeypatch.setattr(fetcher, "MemoryRecords", Seen)

    async def consume() -> int:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            got = 0
            while got < 3000:
                batches = await consumer.getmany(timeout_ms=2000)
                got += sum(len(b) for b in batches.values())
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(consume()) == 3000
    assert codecs and set(codecs) == {wire.CODECS[codec][0]}
