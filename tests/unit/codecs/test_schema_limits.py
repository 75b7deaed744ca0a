"""Schema limits: a record beyond one is refused alone as ``schema_limit``, the lane
schema stays as it was, and the good rows of the same batch decode."""

from __future__ import annotations

import json
import struct
from typing import Any

import pyarrow as pa
import pyarrow.json as pj
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import thalweg.codecs.json as json_codec
from thalweg.codecs.avro import AvroArrowDecoder, StaticSchemas
from thalweg.codecs.base import DecodeReason, DecodeResult
from thalweg.codecs.json import JsonArrowDecoder
from thalweg.codecs.limits import SchemaLimits, Shape, check_schema, scan_json
from thalweg.config.models import KafkaSourceConfig
from thalweg.errors import TicketError
from thalweg.flight.put.plan import plan_put
from thalweg.records import MetadataColumns

COLS = MetadataColumns()


def _decode(decoder: JsonArrowDecoder, payloads: list[bytes]) -> DecodeResult:
    return decoder.decode(pa.array(payloads, pa.binary()))


def _refused(result: DecodeResult) -> dict[int, str]:
    return {f.row: f.message for f in result.failures if f.reason is DecodeReason.SCHEMA_LIMIT}


def _good(i: int) -> bytes:
    return json.dumps({"id": i, "name": f"n{i}", "meta": {"k": i}}).encode()


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every buffer the JSON decoder hands pyarrow's parser."""
    seen: list[bytes] = []
    real = pj.read_json

    def spy(source: Any, *args: Any, **kwargs: Any) -> pa.Table:
        buf = source.read()
        seen.append(buf)
        return real(pa.BufferReader(buf), *args, **kwargs)

    monkeypatch.setattr(pj, "read_json", spy)  # the module the decoder parses with
    return seen


# -- max_columns ---------------------------------------------------------------------


def test_a_record_wider_than_max_columns_never_reaches_the_parser(parsed: list[bytes]) -> None:
    dec = JsonArrowDecoder(COLS, limits=SchemaLimits(max_columns=20))
    bomb = json.dumps({f"bomb{i:04d}": i for i in range(50)}).encode()
    result = _decode(dec, [_good(0), bomb, _good(2)])
    refused = _refused(result)
    assert list(refused) == [1]
    assert "more than 20 distinct fields" in refused[1]
    assert not any(b"bomb0000" in buf for buf in parsed)  # refused before parsing
    assert dec.schema.names == ["id", "name", "meta"]
    assert result.table.column("id").to_pylist() == [0, None, 2]


def test_the_100k_key_record_is_refused_and_its_batch_decodes(parsed: list[bytes]) -> None:
    dec = JsonArrowDecoder(COLS)
    bomb = json.dumps({f"k{i:06d}": i for i in range(100_000)}).encode()
    goods = [_good(i) for i in range(1000)]
    result = _decode(dec, [*goods[:500], bomb, *goods[500:]])
    assert list(_refused(result)) == [500]
    assert [f.row for f in result.failures] == [500]
    assert len(dec.schema) == 3
    assert result.table.column("id").null_count == 1
    assert not any(b"k000000" in buf for buf in parsed)


def test_rows_that_fill_the_lane_past_max_columns_are_refused_in_row_order() -> None:
    dec = JsonArrowDecoder(COLS, limits=SchemaLimits(max_columns=10))
    _decode(dec, [_good(0)])  # id, name, meta, meta.k: 4 fields
    rows = [json.dumps({f"r{r}f{i}": i for i in range(4)}).encode() for r in range(3)]
    result = _decode(dec, [rows[0], rows[1], _good(9), rows[2], rows[0]])
    refused = _refused(result)
    assert sorted(refused) == [1, 3]  # 4 + 4 fits 10; 4 + 4 + 4 does not
    assert "would have 12 fields" in refused[1] and "max_columns (10)" in refused[1]
    assert len(Shape.of(dec.schema).paths) == 8
    assert result.table.column("r0f0").to_pylist() == [0, None, None, None, 0]
    assert result.table.column("id").to_pylist() == [None, None, 9, None, None]
    # Nine of ten: one more field fits, four more do not; known fields always decode.
    later = _decode(dec, [_good(1), b'{"fresh": 1}', rows[1], rows[0]])
    assert list(_refused(later)) == [2]
    assert len(Shape.of(dec.schema).paths) == 9
    assert later.table.column("r0f1").to_pylist() == [None, None, None, 1]


# -- max_depth -----------------------------------------------------------------------


def test_a_record_deeper_than_max_depth_is_refused() -> None:
    dec = JsonArrowDecoder(COLS, limits=SchemaLimits(max_depth=3))
    ok = b'{"a": {"b": [1]}}'  # depth 3
    deep_obj = b'{"q": {"r": {"s": {"t": 1}}}, "id": 1}'  # depth 4
    deep_list = b'{"x": "]]]]", "l": [[[1]]]}'  # depth 4; brackets in a string are text
    result = _decode(dec, [ok, deep_obj, _good(1), deep_list])
    refused = _refused(result)
    assert sorted(refused) == [1, 3]
    assert "nesting depth 4 exceeds max_depth (3)" in refused[1]
    assert Shape.of(dec.schema).depth == 3
    assert "l" not in dec.schema.names and "q" not in dec.schema.names
    assert result.table.column("id").to_pylist() == [None, None, 1, None]


def test_a_very_deep_record_never_reaches_the_parser(parsed: list[bytes]) -> None:
    # 100,000 levels crash pyarrow's JSON reader (recursion); it must not see them.
    dec = JsonArrowDecoder(COLS)
    deep = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    result = _decode(dec, [_good(0), deep, _good(2)])
    refused = _refused(result)
    assert list(refused) == [1]
    assert "nesting depth 100001 exceeds max_depth (32)" in refused[1]
    assert not any(b"[[[[[[" in buf for buf in parsed)
    assert dec.schema.names == ["id", "name", "meta"]


# -- bombs spread over many records ---------------------------------------------------


@pytest.fixture
def widest(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The column count of every table pyarrow's parser builds for the decoder."""
    seen: list[int] = []
    real = pj.read_json

    def spy(source: Any, *args: Any, **kwargs: Any) -> pa.Table:
        table = real(source, *args, **kwargs)
        seen.append(table.num_columns)
        return table

    monkeypatch.setattr(pj, "read_json", spy)
    return seen


def test_medium_bombs_in_many_records_never_build_a_wide_table(widest: list[int]) -> None:
    # 50 records of 900 keys each (each under max_columns): parsed together they were a
    # 45,000-column table (45 s and 6.5 GB for one 10k batch). Chunks bound every parse.
    dec = JsonArrowDecoder(COLS)
    _decode(dec, [_good(0)])
    payloads = [_good(i) for i in range(10_000)]
    for b in range(50):
        payloads[b * 200 + 7] = json.dumps({f"b{b}_{k}": k for k in range(900)}).encode()
    result = _decode(dec, payloads)
    assert sorted(_refused(result)) == [b * 200 + 7 for b in range(50)]
    assert len(result.failures) == 50
    assert dec.schema.names == ["id", "name", "meta"]
    assert max(widest) <= 4 * 1000 + 3
    assert result.table.column("id").null_count == 50


def test_a_flood_of_dynamic_keys_widens_the_lane_by_the_allowance_only(
    widest: list[int],
) -> None:
    # {"<id>": 1} per record: every record a new column.
    dec = JsonArrowDecoder(COLS, limits=SchemaLimits(max_new_fields_per_batch=100))
    _decode(dec, [_good(0)])
    payloads = [json.dumps({"id": i, f"user_{i}": 1}).encode() for i in range(10_000)]
    result = _decode(dec, payloads)
    refused = _refused(result)
    assert len(refused) == 10_000 - 100
    assert min(refused) == 100  # the first 100 new fields fit, in row order
    assert "101 new fields in one batch" in refused[100]
    assert len(dec.schema) == 3 + 100
    assert result.table.column("id").to_pylist()[:101] == [*range(100), None]
    assert max(widest) <= 3 + 4 * 1000  # no parse held all 10,000 new columns
    # The next batch has a new allowance; records that add nothing always decode.
    later = _decode(dec, [_good(1), *payloads[100:300]])
    assert len(_refused(later)) == 100
    assert later.table.column("id").to_pylist()[:2] == [1, 100]


# -- max_name_length -----------------------------------------------------------------


def test_a_field_name_longer_than_max_name_length_is_refused() -> None:
    dec = JsonArrowDecoder(COLS, limits=SchemaLimits(max_name_length=8))
    top = json.dumps({"id": 1, "n" * 9: 1}).encode()
    nested = json.dumps({"id": 2, "meta": {"m" * 20: 1}}).encode()
    result = _decode(dec, [_good(0), top, nested, b'{"id": 3, "exactly8": 1}'])
    refused = _refused(result)
    assert sorted(refused) == [1, 2]
    assert "max_name_length (8)" in refused[1]
    assert "exactly8" in dec.schema.names
    assert "n" * 9 not in dec.schema.names
    assert dec.schema.field("meta").type == pa.struct([("k", pa.int64())])


# -- max_new_fields_per_batch --------------------------------------------------------


def test_one_batch_adds_at_most_max_new_fields_per_batch() -> None:
    dec = JsonArrowDecoder(COLS, limits=SchemaLimits(max_new_fields_per_batch=5))
    a = json.dumps({"a1": 1, "a2": 2, "a3": 3}).encode()
    b = json.dumps({"b1": 1, "b2": 2, "b3": 3}).encode()
    a_again = json.dumps({"a1": 7, "a3": 9}).encode()
    result = _decode(dec, [a, b, a_again])
    refused = _refused(result)
    assert list(refused) == [1]
    assert "6 new fields in one batch, over max_new_fields_per_batch (5)" in refused[1]
    assert dec.schema.names == ["a1", "a2", "a3"]
    assert result.table.column("a1").to_pylist() == [1, None, 7]
    # A new batch has a new allowance.
    later = _decode(dec, [b])
    assert later.failures == ()
    assert dec.schema.names == ["a1", "a2", "a3", "b1", "b2", "b3"]


def test_a_settled_topic_is_not_checked_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    dec = JsonArrowDecoder(COLS)
    _decode(dec, [_good(i) for i in range(10)])

    def boom(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a batch that adds no field was checked")

    monkeypatch.setattr(json_codec, "check", boom)
    assert _decode(dec, [_good(i) for i in range(10, 20)]).failures == ()


# -- the pre-screen's scanner --------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(alphabet='ab{}[]:",\\ ', max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(alphabet='k{]:"\\', max_size=3), inner, max_size=4)
    ),
    max_leaves=25,
)


def _depth_members(v: object) -> tuple[int, int]:
    if isinstance(v, dict):
        inner = [_depth_members(x) for x in v.values()]
        return 1 + max((d for d, _ in inner), default=0), len(v) + sum(m for _, m in inner)
    if isinstance(v, list):
        inner = [_depth_members(x) for x in v]
        return 1 + max((d for d, _ in inner), default=0), sum(m for _, m in inner)
    return 0, 0


@settings(max_examples=60, deadline=None)
@given(st.lists(_json, min_size=1, max_size=8), st.booleans())
def test_the_scanner_counts_depth_and_members_like_a_parser(docs: list[object], ugly: bool) -> None:
    payloads = [json.dumps(d, indent=1 if ugly else None).encode() for d in docs]
    depth, members = scan_json(pa.array(payloads, pa.binary()))
    assert [(int(d), int(m)) for d, m in zip(depth, members, strict=True)] == [
        _depth_members(d) for d in docs
    ]


def test_an_unbalanced_row_does_not_hide_the_next_rows_depth() -> None:
    odd = b'{"a": "unterminated ]]]]]]]]]]'
    deep = b'{"b": ' + b"[" * 40 + b"]" * 40 + b"}"
    depth, _ = scan_json(pa.array([odd, deep], pa.binary()))
    assert int(depth[1]) == 41


# -- writer schemas and puts ---------------------------------------------------------


def _avro(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + body


def test_a_registry_schema_beyond_max_columns_refuses_its_records_unread() -> None:
    small = {"type": "record", "name": "S", "fields": [{"name": "id", "type": "long"}]}
    wide = {
        "type": "record",
        "name": "W",
        "fields": [{"name": f"f{i}", "type": "long"} for i in range(2000)],
    }
    dec = AvroArrowDecoder(COLS, StaticSchemas({1: small, 2: wide}))
    values = pa.array([_avro(1, b"\x02"), _avro(2, b"\x00" * 2000), _avro(1, b"\x04")])
    result = dec.decode(values)
    refused = _refused(result)
    assert list(refused) == [1]
    assert "schema id 2" in refused[1] and "max_columns (1000)" in refused[1]
    assert dec.schema.names == ["id"]
    assert result.table.column("id").to_pylist() == [1, None, 2]


def test_check_schema_names_each_limit() -> None:
    limits = SchemaLimits(max_columns=3, max_depth=2, max_name_length=4)
    assert check_schema(limits, pa.schema([("a", pa.int64())])) is None
    wide = pa.schema([(f"c{i}", pa.int64()) for i in range(4)])
    assert "max_columns (3)" in (check_schema(limits, wide) or "")
    deep = pa.schema([("a", pa.list_(pa.list_(pa.int64())))])
    assert "max_depth (2)" in (check_schema(limits, deep) or "")
    long = pa.schema([("abcde", pa.int64())])
    assert "max_name_length (4)" in (check_schema(limits, long) or "")


def test_a_100k_column_put_is_refused_before_producing() -> None:
    source = KafkaSourceConfig(name="s", bootstrap_servers="127.0.0.1:1", topics=["t"])
    schema = pa.schema([(f"c{i}", pa.int64()) for i in range(100_000)])
    with pytest.raises(TicketError, match=r"schema_limits: .*max_columns \(1000\)"):
        plan_put("t", schema, source)
    narrow = pa.schema([("id", pa.int64()), ("key", pa.binary())])
    assert plan_put("t", narrow, source).payload_columns == ("id",)


def test_the_limits_are_configured_per_source() -> None:
    from thalweg.config import parse_config
    from thalweg.errors import ConfigError
    from thalweg.pipeline.decoders import schema_limits

    cfg = parse_config(
        {
            "sources": [
                {
                    "name": "wide",
                    "kind": "kafka",
                    "bootstrap_servers": "127.0.0.1:1",
                    "topics": ["a"],
                    "schema_limits": {"max_columns": 5000, "max_new_fields_per_batch": 5000},
                },
                {
                    "name": "plain",
                    "kind": "kafka",
                    "bootstrap_servers": "127.0.0.1:1",
                    "topics": ["b"],
                },
            ]
        }
    )
    assert schema_limits(cfg.sources[0]) == SchemaLimits(
        max_columns=5000, max_depth=32, max_name_length=256, max_new_fields_per_batch=5000
    )
    assert schema_limits(cfg.sources[1]) == SchemaLimits()
    with pytest.raises(ConfigError, match=r"schema_limits\.max_depth"):
        parse_config(
            {
                "sources": [
                    {
                        "name": "s",
                        "kind": "kafka",
                        "bootstrap_servers": "127.0.0.1:1",
                        "topics": ["a"],
                        "schema_limits": {"max_depth": 0},
                    }
                ]
            }
        )


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=200), st.integers(0, 2**31))
def test_the_prescreen_bound_holds_across_its_slices(lengths: list[int], seed: int) -> None:
    """The pre-screen counts brackets a slice of the batch's bytes at a time: each
    row's bound is never below its exact count, and equals the bound of one pass over
    the whole batch, whatever slice boundaries the rows span."""
    import random

    import numpy as np

    from thalweg.codecs import limits

    rng = random.Random(seed)
    rows = [bytes(rng.choice(b'{[a":,]}') for _ in range(n)) for n in lengths]
    values = pa.array(rows, pa.binary())
    every = np.arange(len(rows))
    slice_bytes = limits._COUNT_SLICE
    try:
        limits._COUNT_SLICE = 1 << 40  # one pass
        whole = limits._bound_counts(values, b"{[", every).tolist()
        limits._COUNT_SLICE = 4 * limits._BLOCK  # many slices, boundaries inside rows
        sliced = limits._bound_counts(values, b"{[", every).tolist()
    finally:
        limits._COUNT_SLICE = slice_bytes
    exact = [r.count(b"{") + r.count(b"[") for r in rows]
    assert sliced == whole
    assert all(b >= e for b, e in zip(sliced, exact, strict=True))
