"""Kafka Connect's schema wrapper cut before parsing (``codecs/wrapper.py``): events
written ``{"schema":…,"payload":…}`` decode to the rows of their payloads alone, a new
schema is learnt, and anything else reaches the parser as it came."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

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
    cut = SchemaWrapper().unwrap(pa.array(wrapped, pa.binary())).to_pylist()
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
    cut = SchemaWrapper().unwrap(pa.array(vals, pa.binary())).to_pylist()
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


def test_only_the_last_few_schemas_are_kept() -> None:
    wrapper = SchemaWrapper()
    many = [
        compact({"schema": schema("id", f"c{k}"), "payload": change(k)})
        for k in range(SchemaWrapper.KEEP + 3)
    ]
    cut = wrapper.unwrap(pa.array(many, pa.binary())).to_pylist()
    # One batch learns at most KEEP schemas: the rest parse whole, and decode all the same.
    assert sum(c.startswith(b'{"payload":') for c in cut) == SchemaWrapper.KEEP
    assert decode(many).column("id").to_pylist() == list(range(SchemaWrapper.KEEP + 3))


def test_a_schema_that_is_not_json_is_not_learnt_and_the_event_fails_as_before() -> None:
    broken = b'{"schema":{"type":"struct",,"payload":' + compact(change(1, name="a")) + b"}"
    assert SchemaWrapper().unwrap(pa.array([broken], pa.binary())).to_pylist() == [broken]
    result = DebeziumEnvelope(JsonArrowDecoder(COLS)).decode(pa.array([broken], pa.binary()))
    assert [f.row for f in result.failures] == [0]
    assert result.failures[0].reason is DecodeReason.SYNTAX
