"""Confluent-framed Avro: every type through both decode paths, poison records, evolution."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import struct
import uuid
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thalweg.codecs import DecodeReason
from thalweg.codecs.avro import AvroArrowDecoder, StaticSchemas
from thalweg.codecs.typemap import avro_record_schema
from thalweg.records import MetadataColumns

COLS = MetadataColumns()
UTC = dt.UTC

ALL_TYPES: dict[str, Any] = {
    "type": "record",
    "name": "All",
    "namespace": "t",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "by", "type": "bytes"},
        {"name": "n", "type": ["null", "long"]},
        {"name": "n2", "type": ["string", "null"]},
        {"name": "e", "type": {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}},
        {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}},
        {"name": "arr", "type": {"type": "array", "items": "int"}},
        {"name": "m", "type": {"type": "map", "values": "string"}},
        {
            "name": "rec",
            "type": {
                "type": "record",
                "name": "Inner",
                "fields": [{"name": "x", "type": "int"}, {"name": "c", "type": "Colour"}],
            },
        },
        {
            "name": "dec",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3},
        },
        {
            "name": "decf",
            "type": {
                "type": "fixed",
                "name": "D8",
                "size": 8,
                "logicalType": "decimal",
                "precision": 16,
                "scale": 2,
            },
        },
        {"name": "date", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tmi", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tmu", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "tsm", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "ltm", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "ltu", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {
            "name": "dur",
            "type": {"type": "fixed", "name": "Dur", "size": 12, "logicalType": "duration"},
        },
    ],
}


def record(i: int) -> dict[str, Any]:
    return {
        "b": i % 2 == 0,
        "i": -i,
        "l": 2**40 + i,
        "f": 1.5,
        "d": i / 3,
        "s": f"s{i}é",
        "by": bytes([i % 256, 0, 255]),
        "n": None if i % 2 else i,
        "n2": "x" if i % 3 else None,
        "e": "GREEN",
        "fx": b"abcd",
        "arr": list(range(i % 4)),
        "m": {"k": str(i)},
        "rec": {"x": i, "c": "RED"},
        "dec": decimal.Decimal("123.456"),
        "decf": decimal.Decimal("-12.34"),
        "date": dt.date(2026, 11, 30),
        "tmi": dt.time(12, 30, 1, 5000),
        "tmu": dt.time(23, 59, 59, 999999),
        "tsm": dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC),
        "tsu": dt.datetime(1969, 7, 20, 20, 17, 40, 123456, tzinfo=UTC),
        "ltm": dt.datetime(2026, 1, 2, 3, 4, 5, 6000),
        "ltu": dt.datetime(2026, 1, 2, 3, 4, 5, 7),
        "u": uuid.UUID(int=i),
        "dur": b"\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00",
    }


def frame(schema_id: int, schema: Any, rec: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), rec)
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


def expected_row(rec: dict[str, Any]) -> dict[str, Any]:
    out = dict(rec)
    out["u"] = str(rec["u"])
    out["m"] = list(rec["m"].items())
    return out


@pytest.mark.parametrize("native", [True, False], ids=["native", "per-record"])
def test_every_type_and_logical_type(native: bool) -> None:
    values = pa.array([frame(1, ALL_TYPES, record(i)) for i in range(6)], pa.binary())
    dec = AvroArrowDecoder(COLS, StaticSchemas({1: ALL_TYPES}), native=native)
    result = dec.decode(values)
    assert result.failures == ()
    assert result.table.schema == avro_record_schema(ALL_TYPES)
    assert result.table.to_pylist() == [expected_row(record(i)) for i in range(6)]


def test_native_and_per_record_paths_agree() -> None:
    values = pa.array([frame(1, ALL_TYPES, record(i)) for i in range(20)], pa.binary())
    a = AvroArrowDecoder(COLS, StaticSchemas({1: ALL_TYPES})).decode(values).table
    b = AvroArrowDecoder(COLS, StaticSchemas({1: ALL_TYPES}), native=False).decode(values).table
    assert a.equals(b)


def test_type_map() -> None:
    schema = avro_record_schema(ALL_TYPES)
    assert schema.field("n").type == pa.int64() and schema.field("n").nullable
    assert schema.field("dec").type == pa.decimal128(12, 3)
    assert schema.field("tsm").type == pa.timestamp("ms", tz="UTC")
    assert schema.field("ltu").type == pa.timestamp("us")
    assert schema.field("m").type == pa.map_(pa.string(), pa.string())
    assert schema.field("rec").type == pa.struct(
        [pa.field("x", pa.int32(), nullable=False), pa.field("c", pa.string(), nullable=False)]
    )
    union = avro_record_schema(
        {
            "type": "record",
            "name": "U",
            "fields": [{"name": "v", "type": ["int", "string", "null"]}],
        }
    )
    assert union.field("v").type == pa.struct(
        [pa.field("int", pa.int32()), pa.field("string", pa.string())]
    )


SIMPLE = {
    "type": "record",
    "name": "S",
    "fields": [{"name": "id", "type": "long"}, {"name": "s", "type": "string"}],
}


def test_poison_records_fail_alone_with_reasons() -> None:
    good = [frame(1, SIMPLE, {"id": i, "s": "ok"}) for i in range(4)]
    huge_length = b"\x00\x00\x00\x00\x01" + b"\x02" + b"\xfe\xff\xff\xff\x0f" + b"x"  # 2^31 prefix
    bad_utf8 = b"\x00\x00\x00\x00\x01" + b"\x02" + b"\x04" + b"\xff\xfe"
    values = [
        good[0],
        b"\x07" + good[1][1:],
        b"\x00\x00",
        good[1][:-2],
        frame(42, SIMPLE, {"id": 1, "s": ""}),
        huge_length,
        bad_utf8,
        None,
        good[2],
        good[3],
    ]
    result = AvroArrowDecoder(COLS, StaticSchemas({1: SIMPLE})).decode(
        pa.array(values, pa.binary())
    )
    reasons = {f.row: f.reason for f in result.failures}
    assert reasons == {
        1: DecodeReason.BAD_FRAMING,
        2: DecodeReason.BAD_FRAMING,
        3: DecodeReason.SYNTAX,
        4: DecodeReason.UNKNOWN_SCHEMA,
        5: DecodeReason.SYNTAX,
        6: DecodeReason.SYNTAX,
    }
    assert result.table.column("id").to_pylist() == [
        0,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        2,
        3,
    ]
    assert result.errors[7].as_py() is None  # a tombstone is not an error


def test_schema_evolution_additive_and_incompatible() -> None:
    v2 = {
        **SIMPLE,
        "fields": [*SIMPLE["fields"], {"name": "extra", "type": ["null", "int"], "default": None}],
    }
    v3 = {**SIMPLE, "fields": [{"name": "id", "type": "string"}, {"name": "s", "type": "string"}]}
    dec = AvroArrowDecoder(COLS, StaticSchemas({1: SIMPLE, 2: v2, 3: v3}))
    values = [
        frame(1, SIMPLE, {"id": 1, "s": "a"}),
        frame(2, v2, {"id": 2, "s": "b", "extra": 7}),
        frame(3, v3, {"id": "three", "s": "c"}),
    ]
    result = dec.decode(pa.array(values, pa.binary()))
    assert result.table.column_names == ["id", "s", "extra"]
    assert result.table.column("extra").to_pylist() == [None, 7, None]
    assert [f.reason for f in result.failures] == [DecodeReason.SCHEMA_CONFLICT]
    assert dec.schema.field("id").type == pa.int64()  # never changed by the bad writer


def test_reserved_prefix_is_refused() -> None:
    reserved = {"type": "record", "name": "R", "fields": [{"name": "_twg_x", "type": "int"}]}
    dec = AvroArrowDecoder(COLS, StaticSchemas({1: reserved}))
    result = dec.decode(pa.array([frame(1, reserved, {"_twg_x": 1})]))
    assert [f.reason for f in result.failures] == [DecodeReason.RESERVED_FIELD]


A = {"type": "record", "name": "A", "fields": [{"name": "x", "type": "int"}]}
UNIONS = {
    "type": "record",
    "name": "U",
    "fields": [
        {"name": "simple", "type": ["null", "long", "string"]},
        {"name": "complex", "type": [A, {"type": "array", "items": "int"}, "boolean"]},
        # (a record and a map in one union are ambiguous to a writer handed a dict)
        {"name": "kv", "type": [{"type": "map", "values": "long"}, "string"]},
        {
            "name": "nested",
            "type": {
                "type": "record",
                "name": "N",
                "fields": [{"name": "u", "type": ["int", "string"]}],
            },
        },
    ],
}
UNION_ROWS = [
    (
        {"simple": 5, "complex": {"x": 1}, "kv": {"k": 3}, "nested": {"u": 1}},
        {
            "simple": {"long": 5, "string": None},
            "complex": {"A": {"x": 1}, "array": None, "boolean": None},
            "kv": {"map": [("k", 3)], "string": None},
            "nested": {"u": {"int": 1, "string": None}},
        },
    ),
    (
        {"simple": "s", "complex": [1, 2], "kv": "text", "nested": {"u": "t"}},
        {
            "simple": {"long": None, "string": "s"},
            "complex": {"A": None, "array": [1, 2], "boolean": None},
            "kv": {"map": None, "string": "text"},
            "nested": {"u": {"int": None, "string": "t"}},
        },
    ),
    (
        {"simple": None, "complex": True, "kv": {}, "nested": {"u": 2}},
        {
            "simple": None,
            "complex": {"A": None, "array": None, "boolean": True},
            "kv": {"map": [], "string": None},
            "nested": {"u": {"int": 2, "string": None}},
        },
    ),
]


@pytest.mark.parametrize("native", [True, False], ids=["native", "per-record"])
def test_general_unions_become_one_field_per_branch(native: bool) -> None:
    values = pa.array([frame(1, UNIONS, r) for r, _ in UNION_ROWS], pa.binary())
    result = AvroArrowDecoder(COLS, StaticSchemas({1: UNIONS}), native=native).decode(values)
    assert result.failures == ()
    assert result.table.to_pylist() == [want for _, want in UNION_ROWS]


def test_simple_unions_decode_natively_into_the_same_shape() -> None:
    schema = {
        "type": "record",
        "name": "S",
        "fields": [{"name": "v", "type": ["null", "int", "string"]}],
    }
    values = pa.array([frame(1, schema, {"v": v}) for v in (1, "a", None)])
    native = AvroArrowDecoder(COLS, StaticSchemas({1: schema})).decode(values).table
    slow = AvroArrowDecoder(COLS, StaticSchemas({1: schema}), native=False).decode(values).table
    assert native.equals(slow)
    assert native.to_pylist() == [
        {"v": {"int": 1, "string": None}},
        {"v": {"int": None, "string": "a"}},
        {"v": None},
    ]


def test_container_files_decode_through_the_same_type_map() -> None:
    from thalweg.codecs.avro import decode_container

    for codec in ("null", "deflate", "snappy"):
        buf = io.BytesIO()
        fastavro.writer(
            buf, fastavro.parse_schema(ALL_TYPES), [record(i) for i in range(4)], codec=codec
        )
        table, schema = decode_container(buf.getvalue())
        assert schema["name"] == "t.All"
        assert table.schema == avro_record_schema(ALL_TYPES)
        assert table.to_pylist() == [expected_row(record(i)) for i in range(4)], codec
    with pytest.raises(ValueError, match="container"):
        decode_container(b"not avro")


def test_value_decoder_shares_the_columnar_core() -> None:
    from thalweg.codecs import ValueDecoder
    from thalweg.errors import DecodeError

    values = ValueDecoder(AvroArrowDecoder(COLS, StaticSchemas({1: SIMPLE})))
    assert values.decode(frame(1, SIMPLE, {"id": 7, "s": "x"})) == {"id": 7, "s": "x"}
    assert values.decode(None) is None
    with pytest.raises(DecodeError, match="bad_framing"):
        values.decode(b"\x05nope")


PRIMITIVE = st.sampled_from(["boolean", "int", "long", "float", "double", "string", "bytes"])
VALUES = {
    "boolean": st.booleans(),
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False),
    "double": st.floats(allow_nan=False),
    "string": st.text(max_size=20),
    "bytes": st.binary(max_size=20),
}


@st.composite
def schema_and_rows(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    n_fields = draw(st.integers(1, 6))
    fields, strategies = [], {}
    for i in range(n_fields):
        t = draw(PRIMITIVE)
        nullable = draw(st.booleans())
        fields.append({"name": f"f{i}", "type": ["null", t] if nullable else t})
        strategies[f"f{i}"] = st.none() | VALUES[t] if nullable else VALUES[t]
    rows = draw(st.lists(st.fixed_dictionaries(strategies), min_size=1, max_size=15))
    return {"type": "record", "name": "H", "fields": fields}, rows


@settings(max_examples=40, deadline=None)
@given(schema_and_rows())
def test_generated_schemas_decode_identically_on_both_paths(
    case: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    schema, rows = case
    values = pa.array([frame(3, schema, r) for r in rows], pa.binary())
    native = AvroArrowDecoder(COLS, StaticSchemas({3: schema})).decode(values)
    fallback = AvroArrowDecoder(COLS, StaticSchemas({3: schema}), native=False).decode(values)
    assert native.failures == () and fallback.failures == ()
    assert native.table.equals(fallback.table)
    assert native.table.to_pylist() == rows


def test_native_decoding_keeps_row_order_in_a_large_batch() -> None:
    """The native path reads a container file through DataFusion, which does not promise
    row order across partitions (the contract SQL rules needed a row index for that);
    a single-file Avro scan keeps it, and this pins it: 200k rows, in order."""
    schema = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "id", "type": "long"}, {"name": "s", "type": "string"}],
    }
    parsed = fastavro.parse_schema(schema)
    values = []
    for i in range(200_000):
        body = io.BytesIO()
        fastavro.schemaless_writer(body, parsed, {"id": i, "s": "x" * (i % 40)})
        values.append(b"\x00" + struct.pack(">I", 1) + body.getvalue())
    decoder = AvroArrowDecoder(MetadataColumns(), StaticSchemas({1: schema}))
    # The native path itself (decode() would fall back per record, in order, if it failed).
    compiled = decoder._compile(1)
    native = decoder._native_decode(compiled, [v[5:] for v in values])  # type: ignore[arg-type]
    assert native is not None, "the native path did not run"
    assert native.column("id").to_pylist() == list(range(200_000))
    result = decoder.decode(pa.array(values, pa.binary()))
    assert result.failures == ()
    assert result.table.column("id").to_pylist() == list(range(200_000))


@pytest.mark.parametrize("native", [True, False], ids=["native", "per-record"])
def test_a_fields_doc_goes_with_its_column(native: bool) -> None:
    """An Avro field's ``doc`` is its column's ``doc`` metadata, through both decode
    paths and an evolution: what a sink's table comments fall back to."""
    v1 = {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long", "doc": "The order number"},
            {"name": "s", "type": "string"},
        ],
    }
    v2 = {
        **v1,
        "fields": [
            *v1["fields"],
            {"name": "zip", "type": ["null", "string"], "default": None, "doc": "Postal code"},
        ],
    }
    dec = AvroArrowDecoder(COLS, StaticSchemas({1: v1, 2: v2}), native=native)
    values = [frame(1, v1, {"id": 1, "s": "a"}), frame(2, v2, {"id": 2, "s": "b", "zip": "0150"})]
    table = dec.decode(pa.array(values, pa.binary())).table
    docs = {f.name: (f.metadata or {}).get(b"doc") for f in table.schema}
    assert docs == {"id": b"The order number", "s": None, "zip": b"Postal code"}
    assert table.column("zip").to_pylist() == [None, "0150"]
