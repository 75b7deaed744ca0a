"""A Protobuf topic end to end: schemas from the registry's .proto text, or from a file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.registry_server import FakeRegistry
from tests.unit.codecs.test_protobuf import frame
from thalweg.codecs.protobuf import ProtoSchema
from thalweg.registry.protoc import compile_proto

pytestmark = pytest.mark.integration

PROTO = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Order {
  int64 id = 1;
  string customer = 2;
  repeated string tags = 3;
  google.protobuf.Timestamp placed = 4;
}
"""


@pytest.mark.parametrize("source", ["registry", "descriptor_set"])
def test_protobuf_topic(
    source: str,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    registry: FakeRegistry,
    tmp_path: Path,
) -> None:
    topic = topic_factory(1)
    descriptor_set = compile_proto(PROTO)
    order, _ = ProtoSchema(descriptor_set).message([0])
    sid = registry.add(f"{topic}-value", PROTO, schema_type="PROTOBUF")
    for i in range(20):
        msg = order(id=i, customer=f"c{i}", tags=["a"] * (i % 3))
        msg.placed.seconds = 1_700_000_000 + i
        producer.produce(topic, frame(sid, [0], msg.SerializeToString()), partition=0)
    producer.produce(topic, b"\x00\x00\x00", partition=0)  # poison: short header
    expected = 21
    if source == "registry":  # a second schema version adds a field mid-stream
        v2 = PROTO.replace(
            "google.protobuf.Timestamp placed = 4;",
            "google.protobuf.Timestamp placed = 4;\n  string note = 5;",
        )
        sid2 = registry.add(f"{topic}-value", v2, schema_type="PROTOBUF")
        order2, _ = ProtoSchema(compile_proto(v2)).message([0])
        for i in range(20, 25):
            producer.produce(
                topic, frame(sid2, [0], order2(id=i, note=f"n{i}").SerializeToString()), partition=0
            )
        expected = 26
    producer.flush(10)
    if source == "registry":
        opts = {"registry": {"url": registry.url}}
    else:
        path = tmp_path / "shop.pb"
        path.write_bytes(descriptor_set)
        opts = {"protobuf_descriptor_set": str(path)}
    gw = gateway_factory([topic], format="protobuf", **opts)
    gw.wait_durable(topic, {0: expected})
    with thalweg_client.connect(gw.flight_url) as client:
        table = client.read(topic).sort_by("_twg_source_offset")
        dlq = client.read(topic, lane="dlq")
    ids = [*range(20), None] + ([*range(20, 25)] if source == "registry" else [])
    assert table["id"].to_pylist() == ids
    assert table["tags"].to_pylist()[:3] == [[], ["a"], ["a", "a"]]
    assert int(table["placed"][5].as_py().timestamp()) == 1_700_000_005
    assert table["_twg_source_offset"].to_pylist() == list(range(expected))
    if source == "registry":
        assert table["note"].to_pylist() == [None] * 21 + [f"n{i}" for i in range(20, 25)]
    assert dlq["_twg_dlq_reason"].to_pylist() == ["bad_framing"]


@pytest.mark.parametrize("source", ["registry", "descriptor_set"])
def test_put_encodes_payload_columns_as_protobuf(
    source: str,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    registry: FakeRegistry,
    tmp_path: Path,
) -> None:
    """do_put with payload columns on a Protobuf topic: encoded with the topic's message,
    read back through the decoded lane unchanged; a column the message lacks is refused
    before anything is produced."""
    import datetime as dt

    import pyarrow as pa

    topic = topic_factory(1)
    if source == "registry":
        registry.add(f"{topic}-value", PROTO, schema_type="PROTOBUF")
        opts: dict[str, object] = {"registry": {"url": registry.url}}
    else:
        path = tmp_path / "shop.pb"
        path.write_bytes(compile_proto(PROTO))
        opts = {"protobuf_descriptor_set": str(path)}
    gw = gateway_factory([topic], format="protobuf", **opts)
    placed = dt.datetime(2026, 11, 30, 12, 0, 1, tzinfo=dt.UTC)
    rows = pa.table(
        {
            "id": [7, 8],
            "customer": ["ana", "bo"],
            "tags": [["x", "y"], []],
            "placed": pa.array([placed, None], pa.timestamp("us", tz="UTC")),
        }
    )
    with thalweg_client.connect(gw.flight_url) as client:
        with pytest.raises(pa.ArrowInvalid, match="'colour' is not a field"):
            client.write(topic, rows.append_column("colour", pa.array(["r", "g"])))
        assert client.write(topic, rows) == [{"rows": 2, "partitions": {"0": [0, 1]}}]
        gw.wait_durable(topic, {0: 2})
        back = client.read(topic).sort_by("_twg_source_offset")
    assert back["id"].to_pylist() == [7, 8]
    assert back["customer"].to_pylist() == ["ana", "bo"]
    assert back["tags"].to_pylist() == [["x", "y"], []]
    assert back["placed"][0].as_py() == placed
    assert back["_twg_decode_error"].to_pylist() == [None, None]
