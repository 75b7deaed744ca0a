"""The Flight SQL pieces that need no gateway: messages, handles, markers, catalog rows."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import compiled_descriptor
from thalweg.flight.errors import InvalidArgumentError
from thalweg.flight.sql import metadata as md
from thalweg.flight.sql.handles import MAX_HANDLE_BYTES, Statement
from thalweg.flight.sql.messages import M, is_sql, pack, unpack
from thalweg.flight.sql.placeholders import number_markers
from thalweg.flight.sql.selection import Selection, row_wise, selections
from thalweg.flight.sql.tables import _time_span
from thalweg.lane.read.reader import leaf_index
from thalweg.records.columns import MetadataColumns
from thalweg_client.wire import encode_ticket

ROOT = Path(__file__).resolve().parents[3]


def test_the_shipped_descriptor_set_is_compiled_from_the_proto(tmp_path: Path) -> None:
    proto = "arrow/flight/protocol/sql/thalweg_subset.proto"
    compiled = compiled_descriptor(proto, tmp_path / "sql.desc")
    shipped = ROOT / "server/thalweg/flight/sql/flight_sql.desc"
    assert compiled == shipped.read_bytes(), "run `make proto`"


def test_commands_round_trip_and_are_told_apart_from_read_tickets() -> None:
    packed = pack(M["CommandStatementQuery"](query="select 1"))
    assert packed.startswith(b"\n")
    assert is_sql(packed)
    name, msg = unpack(packed)
    assert name == "CommandStatementQuery" and msg.query == "select 1"
    json_ticket = json.dumps({"topic": "t"}).encode()
    binary_ticket = encode_ticket({"v": 1, "topic": "t"})
    assert not is_sql(json_ticket) and not is_sql(binary_ticket) and not is_sql(b"")


def test_unknown_and_malformed_commands_are_refused_by_kind() -> None:
    from google.protobuf import any_pb2

    unknown = any_pb2.Any(type_url="type.googleapis.com/arrow.flight.protocol.sql.Nope")
    with pytest.raises(LookupError):
        unpack(unknown.SerializeToString())
    other = any_pb2.Any(type_url="type.googleapis.com/other.Thing")
    with pytest.raises(ValueError, match="not a Flight SQL command"):
        unpack(other.SerializeToString())
    bad = any_pb2.Any(
        type_url="type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery",
        value=b"\x0a\xff",  # a string field whose length runs past the end
    )
    with pytest.raises(ValueError, match="malformed CommandStatementQuery"):
        unpack(bad.SerializeToString())


def test_statement_handles_carry_the_query_and_its_parameters() -> None:
    params = pa.record_batch({"a": [1.5], "b": ["x"], "c": pa.array([b"\x00"], pa.binary())})
    back = Statement.decode(Statement("select ?, ?, ?", params).encode())
    assert back.sql == "select ?, ?, ?"
    assert back.params is not None and back.params.equals(params)
    assert Statement.decode(Statement("select 1").encode()) == Statement("select 1")


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"{",
        b"[]",
        b'{"f": "twg-sql", "v": 2, "sql": "x"}',
        b'{"f": "twg-sql", "v": 1}',
        b'{"f": "twg-sql", "v": 1, "sql": 3}',
        b'{"f": "twg-sql", "v": 1, "sql": "x", "params": "%%"}',
        b'{"f": "twg-sql", "v": 1, "sql": "x", "params": "AAAA"}',
    ],
)
def test_damaged_handles_are_invalid_arguments(bad: bytes) -> None:
    with pytest.raises(InvalidArgumentError, match="invalid statement handle"):
        Statement.decode(bad)


def test_oversized_statements_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="at most"):
        Statement("x" * MAX_HANDLE_BYTES).encode()


def test_markers_are_numbered_outside_literals_identifiers_and_comments() -> None:
    sql = "select '?', \"a?b\", x -- why?\n from t /* ? */ where a = ? and b = 'it''s ?' or c = ?"
    out, n = number_markers(sql)
    assert n == 2
    assert out == (
        "select '?', \"a?b\", x -- why?\n from t /* ? */ where a = $1 and b = 'it''s ?' or c = $2"
    )
    assert number_markers("select 'unterminated ?") == ("select 'unterminated ?", 0)


@given(st.text(alphabet="ab?'\"-/*\n ", max_size=40))
def test_numbering_only_replaces_markers(sql: str) -> None:
    out, n = number_markers(sql)
    assert re.sub(r"\$\d+", "?", out) == sql  # nothing else changed
    assert [int(m) for m in re.findall(r"\$(\d+)", out)] == list(range(1, n + 1))


def test_sql_info_has_the_specified_schema_and_values() -> None:
    table = md.sql_info([])
    assert table.schema == md.SQL_INFO_SCHEMA
    names = table.column("info_name").to_pylist()
    values = dict(zip(names, table.column("value").to_pylist(), strict=True))
    assert values[md.SERVER_NAME] == "Thalweg"
    assert values[md.SERVER_SQL] is True and values[md.SERVER_READ_ONLY] is False
    assert values[md.IDENTIFIER_QUOTE_CHAR] == '"'
    union = table.column("value").chunk(0)
    codes = dict(zip(names, union.type_codes.to_pylist(), strict=True))
    assert codes[md.SERVER_NAME] == 0 and codes[md.SERVER_SQL] == 1
    assert codes[md.SERVER_TRANSACTION] == 3 and codes[md.IDENTIFIER_CASE] == 3
    asked = md.sql_info([md.SERVER_SQL, 99_999, md.SERVER_NAME])
    assert asked.column("info_name").to_pylist() == [md.SERVER_SQL, md.SERVER_NAME]


def test_like_patterns() -> None:
    rx = md.like("de%")
    assert rx is not None and rx.fullmatch("decoded") and not rx.fullmatch("raw")
    one = md.like("ra_")
    assert one is not None and one.fullmatch("raw") and not one.fullmatch("rawx")
    dots = md.like("a.b")
    assert dots is not None and not dots.fullmatch("axb")
    assert md.like(None) is None


def test_get_tables_filters_sorts_and_serializes_schemas() -> None:
    s = pa.schema([("a", pa.int64())])
    entries = [md.TableEntry("raw", "t2", s), md.TableEntry("decoded", "t1", s)]
    got = md.tables(
        entries,
        catalog=None,
        schema_pattern=None,
        table_pattern="t%",
        table_types=[],
        include_schema=True,
    )
    assert got.column("db_schema_name").to_pylist() == ["decoded", "raw"]
    assert pa.ipc.read_schema(pa.py_buffer(got.column("table_schema")[0].as_py())) == s
    assert not md.tables(
        entries,
        catalog="other",
        schema_pattern=None,
        table_pattern=None,
        table_types=[],
        include_schema=False,
    ).num_rows
    assert not md.tables(
        entries,
        catalog=None,
        schema_pattern=None,
        table_pattern=None,
        table_types=["VIEW"],
        include_schema=False,
    ).num_rows


def _plan(sql: str, tables: dict[str, pa.Schema], schema_name: str = "decoded") -> Any:
    from datafusion import SessionConfig, SessionContext

    from thalweg.flight.sql.engine import _Planning

    ctx = SessionContext(SessionConfig().with_default_catalog_and_schema("thalweg", "decoded"))
    ctx.catalog("thalweg").register_schema(schema_name, _Planning(schema_name, tables, set()))
    return ctx.sql(sql).optimized_logical_plan()


COLS = MetadataColumns("_twg_")
RAW = COLS.raw_schema


@pytest.mark.parametrize(
    ("where", "want"),
    [
        ("_twg_source_partition = 3", Selection(partitions=frozenset([3]))),
        ("3 = _twg_source_partition", Selection(partitions=frozenset([3]))),
        ("_twg_source_partition in (1, 2)", Selection(partitions=frozenset([1, 2]))),
        ("_twg_position between 5 and 9", Selection(position_lo=5, position_hi=9)),
        ("_twg_position > 5 and _twg_position < 9", Selection(position_lo=6, position_hi=8)),
        ("10 <= _twg_position", Selection(position_lo=10)),
        (
            "_twg_source_timestamp >= '2026-01-01T00:00:00Z' and "
            "_twg_source_timestamp < '2026-01-01T00:00:01Z'",
            Selection(ts_lo_ms=1767225600000, ts_hi_ms=1767225601001),
        ),
        # Not selections: other columns, ORs across columns, functions of the column.
        ("_twg_source_partition = 1 or _twg_position = 3", Selection()),
        ("_twg_position + 1 = 3", Selection()),
        ("_twg_source_offset = 3", Selection()),
    ],
)
def test_filters_become_selections(where: str, want: Selection) -> None:
    plan = _plan(f"select * from raw.t where {where}", {"t": RAW}, "raw")
    assert selections(plan, COLS) == {("raw", "t"): want}


def test_a_table_scanned_twice_gets_no_selection_and_is_not_row_wise() -> None:
    plan = _plan(
        "select a._twg_position from raw.t a join raw.t b on a._twg_position = b._twg_position "
        "where a._twg_source_partition = 1",
        {"t": RAW},
        "raw",
    )
    assert selections(plan, COLS) == {("raw", "t"): Selection()}
    assert not row_wise(plan)


@pytest.mark.parametrize(
    ("sql", "splittable"),
    [
        ("select _twg_position from raw.t", True),
        ("select _twg_position * 2 as p from raw.t x where _twg_position > 3", True),
        ("select count(*) from raw.t", False),
        ("select _twg_position from raw.t order by 1", False),
        ("select _twg_position from raw.t limit 3", False),
        ("select distinct _twg_source_partition from raw.t", False),
    ],
)
def test_row_wise_queries(sql: str, splittable: bool) -> None:
    assert row_wise(_plan(sql, {"t": RAW}, "raw")) is splittable


def test_selection_keeps() -> None:
    sel = Selection(partitions=frozenset([1]), position_lo=10, position_hi=20, ts_lo_ms=100)
    assert sel.keeps_partition(1) and not sel.keeps_partition(2)
    assert sel.keeps_positions(0, 10) and sel.keeps_positions(20, 30)
    assert not sel.keeps_positions(0, 9) and not sel.keeps_positions(21, 30)
    assert sel.keeps_times(None, None) and sel.keeps_times(50, 100) and not sel.keeps_times(0, 99)
    assert sel.only(frozenset([1, 2])).partitions == frozenset([1])
    assert Selection().only(frozenset([4])).partitions == frozenset([4])


def test_timestamp_statistics_are_found_behind_the_nested_headers(tmp_path: Path) -> None:
    """The timestamp's leaf column comes after the headers' two: an Arrow field index
    would read the statistics of a header column."""
    ts = pa.array([1_000, 5_000], pa.timestamp("ms", tz="UTC"))
    columns = {f.name: pa.nulls(2, f.type) for f in RAW}
    columns[COLS.timestamp] = ts
    headers = COLS.source("headers")
    columns[headers] = pa.array([[{"key": b"k", "value": b"v"}], []], RAW.field(headers).type)
    path = tmp_path / "seg.parquet"
    pq.write_table(pa.table(columns, schema=RAW), path)
    meta = pq.ParquetFile(path).metadata
    idx = leaf_index(meta, COLS.timestamp)
    assert idx is not None and idx != RAW.get_field_index(COLS.timestamp)
    assert _time_span(path, COLS.timestamp) == (1_000, 5_000)
    assert leaf_index(meta, "nope") is None


def test_tiny_result_batches_are_coalesced_in_order() -> None:
    from thalweg.flight.sql.engine import MIN_BATCH_ROWS, coalesced

    batches = [pa.record_batch({"i": list(range(n * 30, n * 30 + 30))}) for n in range(5000)]
    out = list(coalesced(iter(batches)))
    assert pa.Table.from_batches(out).column("i").to_pylist() == list(range(150_000))
    assert all(b.num_rows >= MIN_BATCH_ROWS for b in out[:-1])
    assert len(out) == 3
    big = pa.record_batch({"i": list(range(MIN_BATCH_ROWS + 1))})
    assert list(coalesced(iter([big]))) == [big]  # passed on as it is
    assert list(coalesced(iter([]))) == []
