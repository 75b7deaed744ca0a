"""Flight SQL's ``latest`` table and the ``do_get`` latest view fold the same lane rows
the same way (``fold_input``: only the columns sent and the fold's own are read)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from datafusion import SessionContext

from tests.unit.lane.test_lane import COLS, R, writer
from thalweg.flight.read.latest import fold_input, fold_latest
from thalweg.flight.read.plan import plan_read
from thalweg.flight.read.stream import read_stream
from thalweg.flight.read.tickets import ReadTicket
from thalweg.flight.sql.selection import EVERYTHING
from thalweg.flight.sql.tables import LaneTables
from thalweg.lane.layout import Lane
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.lane.read.live import LiveTail
from thalweg.records import build_raw_batch

# (key, value, v): a is written twice, b written then tombstoned, c once, one keyless.
EVENTS = [(b"a", b"1", 1), (b"b", b"2", 2), (b"a", b"3", 3), (b"b", None, None), (b"c", b"4", 4)]
EVENTS.append((None, b"5", 5))


def _catalog(tmp_path: Path) -> LaneCatalog:
    layout, w = writer(tmp_path)
    recs = [R("t", 0, o, 0, 0, k, v, ()) for o, (k, v, _) in enumerate(EVENTS)]
    raw = pa.Table.from_batches([build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=COLS)])
    decoded = pa.table(
        {
            "v": pa.array([e[2] for e in EVENTS], pa.int64()),
            COLS.offset: raw.column(COLS.offset),
            COLS.position: raw.column(COLS.position),
            COLS.partition: raw.column(COLS.partition),
            COLS.decode_error: pa.nulls(len(EVENTS), pa.string()),
        }
    )
    w.write("t", 0, raw, decoded, 0, len(EVENTS))
    return LaneCatalog(layout, COLS, LiveTail())


def test_the_sql_latest_table_is_the_fold_of_the_lane(tmp_path: Path) -> None:
    catalog = _catalog(tmp_path)
    tables = LaneTables(catalog)
    schema = tables.schema(Lane.DECODED, "t")
    assert schema is not None and COLS.value not in schema.names
    snapshot = tables.snapshot()
    try:
        got = snapshot.latest_frame(SessionContext(), "t", schema, EVERYTHING).to_arrow_table()
    finally:
        snapshot.close()
    # a's newest (3) and c; b was deleted by its tombstone; the keyless row names no key.
    assert got.column_names == schema.names
    assert sorted(got.column("v").to_pylist()) == [3, 4]
    # The same rows as the fold of everything the lane holds for the partition.
    ticket = ReadTicket(topic="t", partitions=[0], metadata="all")
    whole = fold_latest(read_stream(catalog, plan_read(catalog, ticket), lambda: False), COLS)
    assert whole is not None
    assert got.equals(whole.select(schema.names).cast(schema))


def test_the_fold_reads_only_what_it_sends_and_its_own_columns() -> None:
    sent = pa.schema([("v", pa.int64()), (COLS.position, pa.int64())])
    payload = pa.schema([("v", pa.int64()), ("__deleted", pa.bool_())])
    ticket = fold_input(ReadTicket(topic="t"), sent, COLS, payload)
    assert ticket.columns == [
        "v",
        COLS.position,
        COLS.source("key"),
        COLS.value,
        COLS.partition,
        COLS.decode_error,
        "__deleted",  # a change event's delete, since the payload has one
    ]
    assert COLS.source("headers") not in ticket.columns


def test_a_field_the_topic_no_longer_has_comes_as_nulls(tmp_path: Path) -> None:
    # A query is planned with a schema a moment old: a field gone since (its decoder
    # left with a rebalance) is not asked of the read, and the table gives it as nulls.
    catalog = _catalog(tmp_path)
    tables = LaneTables(catalog)
    known = tables.schema(Lane.DECODED, "t")
    assert known is not None
    schema = known.append(pa.field("gone", pa.string()))
    snapshot = tables.snapshot()
    try:
        got = snapshot.latest_frame(SessionContext(), "t", schema, EVERYTHING).to_arrow_table()
    finally:
        snapshot.close()
    assert sorted(got.column("v").to_pylist()) == [3, 4]
    assert got.column("gone").null_count == got.num_rows == 2


class _Caller:
    """What ``do_get`` asks of a gRPC call's context, for a caller with auth off."""

    def get_middleware(self, key: str) -> None:
        return None

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    def is_cancelled(self) -> bool:
        return False


def _counting(monkeypatch: pytest.MonkeyPatch, module: object) -> list[ReadTicket]:
    """The tickets ``module``'s ``plan_read`` is called with, calling it through."""
    calls: list[ReadTicket] = []
    real = plan_read

    def counted(catalog: LaneCatalog, ticket: ReadTicket, *args: object) -> object:
        calls.append(ticket)
        return real(catalog, ticket, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "plan_read", counted)
    return calls


def test_each_latest_read_is_planned_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its positions are fixed at one moment: the view's answer and the rows it folds
    come from one plan, in Flight SQL's ``latest`` table and in the ``do_get`` view."""
    from thalweg.config.models import FlightServingConfig
    from thalweg.flight.limits import StreamLimiter
    from thalweg.flight.read import service
    from thalweg.flight.sql import tables as sql_tables
    from thalweg.ops.metrics import Metrics

    catalog = _catalog(tmp_path)
    sql_calls = _counting(monkeypatch, sql_tables)
    lane_tables = LaneTables(catalog)
    schema = lane_tables.schema(Lane.DECODED, "t")
    assert schema is not None
    snapshot = lane_tables.snapshot()
    try:
        got = snapshot.latest_frame(SessionContext(), "t", schema, EVERYTHING).to_arrow_table()
    finally:
        snapshot.close()
    assert sorted(got.column("v").to_pylist()) == [3, 4]
    assert len(sql_calls) == 1
    get_calls = _counting(monkeypatch, service)
    reads = service.Reads(
        catalog, Metrics(), FlightServingConfig(), StreamLimiter(4), "grpc://127.0.0.1:1"
    )
    reads.do_get(_Caller(), ReadTicket(topic="t", view="latest", columns=["v"]))  # type: ignore[arg-type]
    assert len(get_calls) == 1
    # The one plan reads the fold's columns besides the one asked.
    assert get_calls[0].columns is not None and {"v", COLS.position} <= set(get_calls[0].columns)
