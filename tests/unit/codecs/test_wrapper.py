"""Kafka Connect's schema wrapper cut before parsing (``codecs/wrapper.py``): events
written ``{"schema":…,"payload":…}`` decode to the rows of their payloads alone, a new
schema is learnt, and anything else reaches the parser as it came."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from thalweg.codecs import DecodeReason
from thalweg.codecs.envelope import DebeziumEnvelope
from thalweg.codecs.json import JsonArrowDecoder
from thalweg.codecs.wrapper import SchemaWrapper
from thalweg.records import MetadataColumns

COLS = MetadataColumns()


def schema(*names: str) -> dict[str, Any]:
    """A JsonConverter schema of an envelope whose rows have ``names`` (abridged)."""
    row = [{"type": "string", "optional": True, "field": n} for n in names]
    fields = [{"type": "struct", "fields": row, "optional": True, "field": f} for f in ("a", "b")]
    return {"type": "struct", "fields": fields, "name": "dbserver1.inventory.t.Envelope"}


def compact(doc: Any) -> bytes:
    """As the JsonConverter writes: no spaces."""
    return json.dumps(doc, separators=(",", ":")).encode()


def change(i: int, **row: Any) -> dict[str, Any]:
    return {"before": None, "after": {"id": i, **row}, "op": "c", "source": {"lsn": i}}


def decode(vals: list[bytes | None]) -> pa.Table:
    result = DebeziumEnvelope(JsonArrowDecoder(COLS)).decode(pa.array(vals, pa.binary()))
    assert not result.failures, result.failures
    return result.table


def test_wrapped_events_decode_as_their_payloads_alone() -> None:
    events = [change(i, name=f"n{i}") for i in range(5)]
    wrapped = [compact({"schema": schema("id", "name"), "payload": e}) for e in events]
    cut = SchemaWrapper().unwrap(pa.array(wrapped, pa.binary()))[0].to_pylist()
    assert all(c.startswith(b'{"payload":{"before"') for c in cut)
    assert [json.loads(c) for c in cut] == [{"payload": e} for e in events]
    # The same rows as the payloads unwrapped by hand.
    assert decode(wrapped).equals(decode([compact(e) for e in events]))


def test_each_schema_is_learnt_and_other_shapes_pass_as_they_came() -> None:
    first, second = schema("id", "name"), schema("id", "name", "email")
    vals = [
        compact({"schema": first, "payload": change(1, name="a")}),
        None,  # a tombstone stays one
        compact({"schema": second, "payload": change(2, name="b", email="b@x")}),
        json.dumps({"schema": first, "payload": change(3, name="c")}).encode(),  # spaced
        compact(change(4, name="d")),  # not wrapped
        compact({"schema": first, "payload": change(5, name="e")}),
    ]
    cut = SchemaWrapper().unwrap(pa.array(vals, pa.binary()))[0].to_pylist()
    assert [c is not None and c.startswith(b'{"payload":') for c in cut] == [
        True,
        False,
        True,
        False,
        False,
        True,
    ]
    assert cut[1] is None and cut[3] == vals[3] and cut[4] == vals[4]
    got = decode(vals)  # the tombstone is a row of its own: a delete with no image
    assert got.column("id").to_pylist() == [1, None, 2, 3, 4, 5]
    assert got.column("email").to_pylist() == [None, None, "b@x", None, None, None]
    assert got.column("__deleted").to_pylist() == [False, True, False, False, False, False]


def test_whether_an_event_is_cut_depends_on_its_bytes_alone() -> None:
    """More schemas in a batch than the wrapper keeps are all cut; an event it cannot
    cut does not stop the ones after it — a batch decodes every event as alone."""
    wrapper = SchemaWrapper()
    many = [
        compact({"schema": schema("id", f"c{k}"), "payload": change(k)})
        for k in range(SchemaWrapper.KEEP + 3)
    ]
    spaced = json.dumps({"schema": schema("id"), "payload": change(99)}).encode()
    vals, cut = wrapper.unwrap(pa.array([spaced, *many], pa.binary()))
    assert cut.tolist() == [False] + [True] * len(many)
    assert all(v.startswith(b'{"payload":') for v in vals.to_pylist()[1:])
    alone = [SchemaWrapper().unwrap(pa.array([v], pa.binary()))[1][0] for v in many]
    assert alone == [True] * len(many)
    assert decode(many).column("id").to_pylist() == list(range(SchemaWrapper.KEEP + 3))


@pytest.mark.parametrize(
    "bad_schema",
    [
        b'{"type":"struct",,',  # not JSON
        b'{"type":"struct","type":"x"}',  # a key twice
        b'{"type":"struct","default":1e999}',  # no double holds it
        b'{"type":"struct","doc":"\\ud800"}',  # a lone surrogate
    ],
)
def test_a_schema_the_reader_would_refuse_is_not_cut_and_the_event_fails_as_before(
    bad_schema: bytes,
) -> None:
    event = b'{"schema":' + bad_schema + b',"payload":' + compact(change(1, name="a")) + b"}"
    spaced = json.dumps({"schema": schema("id"), "payload": change(2)}).encode()
    for batch in ([event], [spaced, event], [event, spaced]):
        vals, cut = SchemaWrapper().unwrap(pa.array(batch, pa.binary()))
        assert not cut.any() and vals.to_pylist() == batch
        result = DebeziumEnvelope(JsonArrowDecoder(COLS)).decode(pa.array(batch, pa.binary()))
        assert [f.row for f in result.failures] == [batch.index(event)]
        assert result.failures[0].reason is DecodeReason.SYNTAX


def test_an_event_naming_schema_again_after_its_payload_is_refused_as_whole() -> None:
    twice = compact({"schema": schema("id"), "payload": change(1)})[:-1] + b',"schema":{}}'
    result = DebeziumEnvelope(JsonArrowDecoder(COLS)).decode(pa.array([twice], pa.binary()))
    assert [(f.row, f.reason) for f in result.failures] == [(0, DecodeReason.SYNTAX)]


def test_a_schema_the_reader_cannot_type_no_longer_stops_its_event() -> None:
    # Defaults of different types in one fields list: read whole, the reader refuses a
    # list whose items change type, and the event was a dead letter for its schema.
    fields = [
        {"type": "int32", "default": 0, "field": "id"},
        {"type": "string", "default": "none", "field": "name"},
    ]
    odd = {"type": "struct", "fields": fields}
    whole = json.dumps({"schema": odd, "payload": change(1, name="a")}).encode()  # spaced
    cut = compact({"schema": odd, "payload": change(1, name="a")})
    refused = DebeziumEnvelope(JsonArrowDecoder(COLS)).decode(pa.array([whole], pa.binary()))
    assert [f.reason for f in refused.failures] == [DecodeReason.TYPE_CONFLICT]
    assert "/schema/fields" in refused.failures[0].message
    assert decode([cut]).column("name").to_pylist() == ["a"]
