"""Debezium change events into rows (``codecs/envelope.py``): JSON with and without the
converter's schema/payload wrapper, Avro through the registry, deletes, tombstones, and
the envelopes that name no row."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from tests.unit.codecs.test_avro import frame
from thalweg.codecs import DecodeReason
from thalweg.codecs.avro import AvroArrowDecoder, StaticSchemas
from thalweg.codecs.envelope import DebeziumEnvelope
from thalweg.codecs.json import JsonArrowDecoder
from thalweg.records import MetadataColumns

COLS = MetadataColumns()
SOURCE = {"connector": "postgresql", "lsn": 100, "ts_ms": 1_700_000_000_000}


def event(op: str, before: Any = None, after: Any = None, **more: Any) -> dict[str, Any]:
    return {"before": before, "after": after, "op": op, "source": SOURCE, "ts_ms": 7, **more}


def wrapped(payload: dict[str, Any]) -> dict[str, Any]:
    """The JsonConverter's form with schemas enabled (the schema is abridged)."""
    schema = {"type": "struct", "fields": [{"type": "struct", "field": "after"}], "name": "E"}
    return {"schema": schema, "payload": payload}


def values(*docs: Any) -> pa.Array:
    out = [
        None if d is None else d if isinstance(d, bytes) else json.dumps(d).encode() for d in docs
    ]
    return pa.array(out, pa.binary())


def decoder(schema: pa.Schema | None = None) -> DebeziumEnvelope:
    return DebeziumEnvelope(JsonArrowDecoder(COLS), schema)


def test_each_event_becomes_the_row_it_names_with_the_operation_beside_it() -> None:
    got = decoder().decode(
        values(
            event("r", after={"id": 1, "name": "ada"}),
            event("c", after={"id": 2, "name": "bob"}),
            event("u", before={"id": 2, "name": "bob"}, after={"id": 2, "name": "rob"}),
            event("d", before={"id": 1, "name": "ada"}),
        )
    )
    assert got.failures == ()
    rows = got.table.select(["id", "name", "__op", "__deleted", "__ts_ms"]).to_pylist()
    assert rows == [
        {"id": 1, "name": "ada", "__op": "r", "__deleted": False, "__ts_ms": 7},
        {"id": 2, "name": "bob", "__op": "c", "__deleted": False, "__ts_ms": 7},
        {"id": 2, "name": "rob", "__op": "u", "__deleted": False, "__ts_ms": 7},
        {"id": 1, "name": "ada", "__op": "d", "__deleted": True, "__ts_ms": 7},  # before
    ]
    assert got.table.column("__source").to_pylist() == [SOURCE] * 4


def test_the_schema_payload_wrapper_reads_like_the_bare_envelope() -> None:
    bare = event("c", after={"id": 1, "name": "ada"})
    got = decoder().decode(values(wrapped(bare), bare))
    assert got.failures == ()
    assert "schema" not in got.table.column_names and "payload" not in got.table.column_names
    first, second = got.table.to_pylist()
    assert first == second


def test_a_tombstone_deletes_its_key_and_a_delete_without_before_is_kept() -> None:
    got = decoder().decode(values(event("c", after={"id": 1}), event("d"), None))
    assert got.failures == ()
    rows = got.table.select(["id", "__op", "__deleted"]).to_pylist()
    assert rows == [
        {"id": 1, "__op": "c", "__deleted": False},
        {"id": None, "__op": "d", "__deleted": True},  # the record key names the row
        {"id": None, "__op": "d", "__deleted": True},  # a tombstone: null value
    ]


def test_an_envelope_that_names_no_row_is_refused_as_envelope() -> None:
    got = decoder().decode(
        values(
            event("c", after={"id": 1}),
            {"after": {"id": 2}},  # no op
            event("x", after={"id": 3}),  # unknown op
            event("t"),  # a truncate names no row
            event("u", before={"id": 4}),  # an update without after
            {"op": 5, "after": {"id": 6}},  # op is not text: the envelope's own schema refuses it
            b"{not json",
        )
    )
    reasons = {f.row: f.reason for f in got.failures}
    assert reasons == {
        1: DecodeReason.ENVELOPE,
        2: DecodeReason.ENVELOPE,
        3: DecodeReason.ENVELOPE,
        4: DecodeReason.ENVELOPE,
        5: DecodeReason.TYPE_CONFLICT,
        6: DecodeReason.SYNTAX,
    }
    assert got.table.column("id").to_pylist() == [1, None, None, None, None, None, None]
    assert got.errors.to_pylist()[3] == "envelope: a truncate event names no row"


def test_a_row_field_named_like_a_change_column_is_refused() -> None:
    got = decoder().decode(values(event("c", after={"id": 1, "__op": "mine"})))
    assert [f.reason for f in got.failures] == [DecodeReason.ENVELOPE]
    assert "'__op'" in got.failures[0].message


def test_a_restart_keeps_the_lane_schema_and_a_changed_key_type_is_a_conflict() -> None:
    first = decoder()
    first.decode(values(event("c", after={"id": 1, "name": "ada"})))
    again = decoder(first.schema)  # pinned from the decoded lane, the envelope decoder fresh
    got = again.decode(values(event("c", after={"id": 2})))
    assert got.failures == ()
    assert got.table.schema == first.schema
    assert got.table.column("name").to_pylist() == [None]
    clash = again.decode(values(event("c", after={"id": {"nested": True}})))
    assert [f.reason for f in clash.failures] == [DecodeReason.TYPE_CONFLICT]
    assert again.schema == first.schema  # unchanged by the refused rows


AVRO_ROW = {
    "type": "record",
    "name": "Value",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"]}],
}
AVRO_ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "fields": [
        {"name": "before", "type": ["null", AVRO_ROW], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}


def test_avro_events_through_the_registry_decode_the_same_way() -> None:
    docs = [
        {"before": None, "after": {"id": 1, "name": "ada"}, "op": "c", "ts_ms": 1},
        {"before": {"id": 1, "name": "ada"}, "after": None, "op": "d", "ts_ms": 2},
    ]
    avro = pa.array([frame(3, AVRO_ENVELOPE, d) for d in docs], pa.binary())
    inner = AvroArrowDecoder(COLS, StaticSchemas({3: AVRO_ENVELOPE}))
    got = DebeziumEnvelope(inner).decode(avro)
    assert got.failures == ()
    assert got.table.select(["id", "name", "__op", "__deleted", "__ts_ms"]).to_pylist() == [
        {"id": 1, "name": "ada", "__op": "c", "__deleted": False, "__ts_ms": 1},
        {"id": 1, "name": "ada", "__op": "d", "__deleted": True, "__ts_ms": 2},
    ]
