"""Debezium's unavailable-value placeholder never reaches the decoded lane
(``codecs/unavailable.py``): the cell is null and ``__unavailable`` names the column, in
each form the connector sends it (text, bytea as bytes or base64 text, a one-element
array), and under the connector's own placeholder."""

from __future__ import annotations

import base64

import pyarrow as pa

from tests.unit.codecs.test_avro import frame
from tests.unit.codecs.test_envelope import COLS, event, values
from thalweg.codecs import DecodeReason
from thalweg.codecs.avro import AvroArrowDecoder, StaticSchemas
from thalweg.codecs.envelope import DebeziumEnvelope
from thalweg.codecs.json import JsonArrowDecoder
from thalweg.codecs.unavailable import PLACEHOLDER, UNAVAILABLE

B64 = base64.b64encode(PLACEHOLDER.encode()).decode()


def test_each_form_of_the_placeholder_becomes_a_null_named_in_unavailable() -> None:
    got = DebeziumEnvelope(JsonArrowDecoder(COLS)).decode(
        values(
            event("c", after={"id": 1, "bio": "long", "pic": "AAE=", "tags": ["a", "b"]}),
            event("u", after={"id": 1, "bio": PLACEHOLDER, "pic": B64, "tags": [PLACEHOLDER]}),
            event("u", after={"id": 1, "bio": "new", "pic": "AAE=", "tags": [PLACEHOLDER, "x"]}),
            event("u", after={"id": 1, "bio": "new", "pic": None, "tags": []}),
            None,  # a tombstone
        )
    )
    assert got.failures == ()
    rows = got.table.select(["bio", "pic", "tags", UNAVAILABLE]).to_pylist()
    assert rows == [
        {"bio": "long", "pic": "AAE=", "tags": ["a", "b"], UNAVAILABLE: None},
        {"bio": None, "pic": None, "tags": None, UNAVAILABLE: ["bio", "pic", "tags"]},
        # An array holding the placeholder among other values is a value.
        {"bio": "new", "pic": "AAE=", "tags": [PLACEHOLDER, "x"], UNAVAILABLE: None},
        {"bio": "new", "pic": None, "tags": [], UNAVAILABLE: None},
        {"bio": None, "pic": None, "tags": None, UNAVAILABLE: None},
    ]
    # The column keeps its type: a later event's value fits the lane.
    assert got.table.schema.field("bio").type == pa.string()


def test_no_placeholder_adds_no_column() -> None:
    got = DebeziumEnvelope(JsonArrowDecoder(COLS)).decode(values(event("c", after={"id": 1})))
    assert UNAVAILABLE not in got.table.column_names


def test_the_connectors_own_placeholder_is_the_one_set_aside() -> None:
    docs = [
        event("u", after={"id": 1, "bio": "??"}),
        event("u", after={"id": 2, "bio": PLACEHOLDER}),
    ]
    got = DebeziumEnvelope(JsonArrowDecoder(COLS), placeholder="??").decode(values(*docs))
    rows = got.table.select(["id", "bio", UNAVAILABLE]).to_pylist()
    assert rows == [
        {"id": 1, "bio": None, UNAVAILABLE: ["bio"]},
        {"id": 2, "bio": PLACEHOLDER, UNAVAILABLE: None},  # not this connector's
    ]


AVRO_ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "fields": [
        {
            "name": "after",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Value",
                    "fields": [
                        {"name": "id", "type": "long"},
                        {"name": "pic", "type": ["null", "bytes"]},
                    ],
                },
            ],
            "default": None,
        },
        {"name": "op", "type": "string"},
    ],
}


def test_a_bytea_placeholder_in_avro_is_its_bytes() -> None:
    docs = [
        {"after": {"id": 1, "pic": b"\x00\x01"}, "op": "c"},
        {"after": {"id": 1, "pic": PLACEHOLDER.encode()}, "op": "u"},
    ]
    avro = pa.array([frame(3, AVRO_ENVELOPE, d) for d in docs], pa.binary())
    got = DebeziumEnvelope(AvroArrowDecoder(COLS, StaticSchemas({3: AVRO_ENVELOPE}))).decode(avro)
    assert got.failures == ()
    assert got.table.select(["pic", UNAVAILABLE]).to_pylist() == [
        {"pic": b"\x00\x01", UNAVAILABLE: None},
        {"pic": None, UNAVAILABLE: ["pic"]},
    ]


def test_a_row_with_a_field_named_unavailable_is_refused() -> None:
    got = DebeziumEnvelope(JsonArrowDecoder(COLS)).decode(
        values(event("c", after={"id": 1, UNAVAILABLE: ["x"]}))
    )
    assert [f.reason for f in got.failures] == [DecodeReason.ENVELOPE]
