"""Encoders: Arrow rows → framed Avro / JSON, decoding back to the same table."""

from __future__ import annotations

import pyarrow as pa

from tests.unit.codecs.test_avro import ALL_TYPES, frame, record
from thalweg.codecs import JsonArrowDecoder
from thalweg.codecs.avro import AvroArrowDecoder, StaticSchemas
from thalweg.codecs.encode import AvroEncoder, JsonEncoder
from thalweg.codecs.typemap import arrow_schema_to_avro, avro_record_schema
from thalweg.records import MetadataColumns

COLS = MetadataColumns()


def test_avro_encoder_round_trips_every_type() -> None:
    values = pa.array([frame(1, ALL_TYPES, record(i)) for i in range(5)], pa.binary())
    table = AvroArrowDecoder(COLS, StaticSchemas({1: ALL_TYPES})).decode(values).table
    encoded = AvroEncoder(1, ALL_TYPES).encode(table)
    assert encoded == values.to_pylist()  # byte-identical to what the writer produced


def test_schema_derived_from_arrow_maps_back_to_the_same_arrow() -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("name", pa.string()),
            pa.field("price", pa.decimal128(10, 2)),
            pa.field("at", pa.timestamp("us", tz="UTC")),
            pa.field("tags", pa.list_(pa.string())),
            pa.field("attrs", pa.map_(pa.string(), pa.int32())),
            pa.field(
                "where", pa.struct([pa.field("lat", pa.float64()), pa.field("lon", pa.float64())])
            ),
        ]
    )
    avro = arrow_schema_to_avro(schema, "Row")
    assert avro_record_schema(avro).field("price").type == pa.decimal128(10, 2)
    assert avro_record_schema(avro).field("at").type == pa.timestamp("us", tz="UTC")
    table = pa.Table.from_pylist(
        [
            {
                "id": 1,
                "name": "a",
                "price": None,
                "at": None,
                "tags": ["x"],
                "attrs": [("k", 1)],
                "where": {"lat": 1.0, "lon": 2.0},
            }
        ],
        schema=schema,
    )
    payloads = AvroEncoder(7, avro).encode(table)
    back = AvroArrowDecoder(COLS, StaticSchemas({7: avro})).decode(pa.array(payloads)).table
    assert back.to_pylist() == table.to_pylist()


def test_json_encoder_round_trips() -> None:
    table = pa.table({"id": [1, 2], "name": ["a", None], "tags": [["x"], []]})
    payloads = JsonEncoder().encode(table)
    back = JsonArrowDecoder(COLS).decode(pa.array(payloads))
    assert back.failures == ()
    assert back.table.select(["id", "name"]).to_pylist() == table.select(["id", "name"]).to_pylist()
