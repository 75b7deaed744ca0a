"""Confluent-framed Protobuf: every field kind, message indexes, well-known types, poison."""

from __future__ import annotations

import datetime as dt
import struct

import pyarrow as pa
import pytest

from thalweg.codecs import DecodeReason
from thalweg.codecs.framing import zigzag_varint
from thalweg.codecs.protobuf import ProtobufArrowDecoder, ProtoSchema, message_indexes
from thalweg.records import MetadataColumns
from thalweg.registry.protoc import compile_proto

COLS = MetadataColumns()

PROTO = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";

enum Status { UNKNOWN = 0; PAID = 1; SHIPPED = 2; }

message Order {
  int64 id = 1;
  int32 qty = 2;
  uint32 u32 = 3;
  uint64 u64 = 4;
  sint64 s64 = 5;
  double price = 6;
  float f = 7;
  bool gift = 8;
  string customer = 9;
  bytes blob = 10;
  Status status = 11;
  Address ship_to = 12;
  repeated string tags = 13;
  map<string, int32> counts = 14;
  google.protobuf.Timestamp placed = 15;
  google.protobuf.Duration wait = 16;
  google.protobuf.Int64Value maybe = 17;
  google.protobuf.StringValue note = 18;
  optional int32 opt = 19;
  oneof pay { string card = 20; string cash = 21; }
  repeated Address history = 22;
  message Line { string sku = 1; }
}

message Address { string city = 1; string zip = 2; }
message Node { string name = 1; Node next = 2; }
"""


@pytest.fixture(scope="module")
def schema() -> ProtoSchema:
    return ProtoSchema(compile_proto(PROTO))


def frame(schema_id: int, indexes: list[int], body: bytes) -> bytes:
    zz = zigzag_varint
    idx = b"\x00" if indexes == [0] else zz(len(indexes)) + b"".join(zz(i) for i in indexes)
    return b"\x00" + struct.pack(">I", schema_id) + idx + body


class One:
    def __init__(self, schema: ProtoSchema) -> None:
        self.schema = schema

    def get(self, schema_id: int) -> ProtoSchema | None:
        return self.schema if schema_id == 1 else None


def test_every_field_kind(schema: ProtoSchema) -> None:
    Order, arrow = schema.message([0])
    full = Order(
        id=1,
        qty=-2,
        u32=3,
        u64=2**63,
        s64=-5,
        price=1.5,
        f=0.5,
        gift=True,
        customer="ada",
        blob=b"\x00\xff",
        status=2,
        tags=["a", "b"],
        maybe={"value": 7},
        note={"value": "hi"},
        opt=0,
        card="visa",
    )
    full.ship_to.city = "Lisbon"
    full.counts["x"] = 1
    full.placed.FromDatetime(dt.datetime(2026, 11, 30, 12, 0, 0, 123456))
    full.wait.FromTimedelta(dt.timedelta(seconds=90))
    full.history.add(city="Porto")
    empty = Order()
    values = pa.array(
        [frame(1, [0], full.SerializeToString()), frame(1, [0], empty.SerializeToString())]
    )
    result = ProtobufArrowDecoder(COLS, One(schema)).decode(values)
    assert result.failures == ()
    assert result.table.schema == arrow
    a, b = result.table.to_pylist()
    assert a["status"] == "SHIPPED" and b["status"] == "UNKNOWN"
    assert a["u64"] == 2**63 and a["s64"] == -5 and a["blob"] == b"\x00\xff"
    assert a["ship_to"] == {"city": "Lisbon", "zip": ""} and b["ship_to"] is None
    assert a["tags"] == ["a", "b"] and a["counts"] == [("x", 1)]
    assert a["placed"] == dt.datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=dt.UTC)
    assert a["wait"] == dt.timedelta(seconds=90) and b["placed"] is None
    assert a["maybe"] == 7 and b["maybe"] is None and a["note"] == "hi"
    assert a["opt"] == 0 and b["opt"] is None  # proto3 optional keeps presence
    assert a["card"] == "visa" and a["cash"] is None  # oneof: only the set member
    assert a["history"] == [{"city": "Porto", "zip": ""}]
    assert arrow.field("u64").type == pa.uint64()
    assert arrow.field("counts").type == pa.map_(pa.string(), pa.int32())
    assert arrow.field("placed").type == pa.timestamp("us", tz="UTC")


def test_message_indexes_pick_the_type(schema: ProtoSchema) -> None:
    Address, _ = schema.message([1])
    Line, _ = schema.message([0, 1])  # [0, 0] is the map entry CountsEntry
    values = pa.array(
        [
            frame(1, [1], Address(city="Faro").SerializeToString()),
            frame(1, [0, 1], Line(sku="s-1").SerializeToString()),
        ]
    )
    result = ProtobufArrowDecoder(COLS, One(schema)).decode(values)
    assert result.failures == ()
    rows = result.table.to_pylist()
    assert rows[0]["city"] == "Faro" and rows[1]["sku"] == "s-1"
    assert message_indexes(b"\x00rest") == ([0], 1)
    assert message_indexes(b"\x04\x02\x00") == ([1, 0], 3)


def test_poison(schema: ProtoSchema) -> None:
    Order, _ = schema.message([0])
    good = Order(id=5).SerializeToString()
    values = pa.array(
        [
            frame(1, [0], good),
            b"\x09" + frame(1, [0], good)[1:],  # bad magic
            frame(2, [0], good),  # unknown id
            frame(1, [0], b"\x0a\xff\xff"),  # truncated length-delimited field
            frame(1, [7], good),  # no message at index 7
            frame(1, [2], b""),  # recursive Node: no finite Arrow type
            None,
        ]
    )
    result = ProtobufArrowDecoder(COLS, One(schema)).decode(values)
    assert {f.row: f.reason for f in result.failures} == {
        1: DecodeReason.BAD_FRAMING,
        2: DecodeReason.UNKNOWN_SCHEMA,
        3: DecodeReason.SYNTAX,
        4: DecodeReason.BAD_FRAMING,
        5: DecodeReason.UNSUPPORTED,
    }
    assert result.table.column("id").to_pylist()[0] == 5


def test_protobuf_encoder_round_trips(schema: ProtoSchema) -> None:
    from thalweg.codecs.encode import ProtobufEncoder

    Order, _ = schema.message([0])
    msg = Order(id=3, customer="grace", status=1, tags=["t"], blob=b"\x01", maybe={"value": 9})
    msg.counts["k"] = 2
    msg.placed.FromDatetime(dt.datetime(2026, 1, 1, 0, 0, 0, 5))
    msg.wait.FromTimedelta(dt.timedelta(seconds=1, microseconds=500))
    msg.ship_to.city = "Lagos"
    decoded = ProtobufArrowDecoder(COLS, One(schema)).decode(
        pa.array([frame(1, [0], msg.SerializeToString())])
    )
    encoded = ProtobufEncoder(1, Order, [0]).encode(decoded.table)
    again = ProtobufArrowDecoder(COLS, One(schema)).decode(pa.array(encoded))
    assert again.failures == ()
    assert again.table.to_pylist() == decoded.table.to_pylist()
    assert Order.FromString(encoded[0][6:]) == msg
