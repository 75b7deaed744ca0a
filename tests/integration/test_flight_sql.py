"""Flight SQL with a real client: ADBC's Flight SQL driver against a gateway on tansu."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
import duckdb
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from adbc_driver_flightsql import DatabaseOptions
from adbc_driver_manager import AdbcStatusCode, Error
from confluent_kafka import Producer
from datafusion import SessionContext

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import READER, TOKENS, produce_json, wait_until
from thalweg.embedded import TansuBroker
from thalweg.flight.sql.messages import M, pack

pytestmark = pytest.mark.integration

ORDERS = [
    {"customer": f"c{i % 5}", "amount": float(i), "note": "x" if i % 3 else None} for i in range(60)
]


def _connect(gw: RunningGateway, token: str | None = None) -> flight_sql.Connection:
    kwargs = {DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {token}"} if token else {}
    return flight_sql.connect(gw.flight_url, db_kwargs=kwargs, autocommit=True)


def _run(cur: flight_sql.Cursor, sql: str) -> pa.Table:
    cur.execute(sql)
    return cur.fetch_arrow_table()


def _sorted(table: pa.Table) -> list[dict[str, object]]:
    return sorted(table.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


@pytest.fixture
def orders(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    broker: TansuBroker,
) -> tuple[RunningGateway, str]:
    topic = topic_factory(2)
    produce_json(broker.bootstrap, topic, ORDERS, partition=lambda i: i % 2, producer=producer)
    gw = gateway_factory([topic])
    gw.wait_durable(topic, {0: 30, 1: 30})
    return gw, topic


def test_query_equals_datafusion_on_the_lane_files(orders: tuple[RunningGateway, str]) -> None:
    gw, topic = orders
    sql = (
        'select customer, sum(amount) as total from decoded."{t}" '
        "where _twg_source_partition = 1 group by 1"
    )
    with _connect(gw) as conn, conn.cursor() as cur:
        cur.execute(sql.format(t=topic))
        got = cur.fetch_arrow_table()
    # The same query, by DataFusion, straight on the decoded lane's files.
    ctx = SessionContext()
    files = sorted((gw.data_dir / "decoded").rglob("*.parquet"))
    assert files
    ctx.register_parquet("lane", str(files[0].parent.parent))
    want = ctx.sql(sql.format(t=topic).replace(f'decoded."{topic}"', "lane")).to_arrow_table()
    assert _sorted(got) == _sorted(want)
    assert sum(r["total"] for r in got.to_pylist()) == sum(o["amount"] for o in ORDERS[1::2])


def test_prepared_statement_with_parameters(orders: tuple[RunningGateway, str]) -> None:
    gw, topic = orders
    with _connect(gw) as conn, conn.cursor() as cur:
        sql = f'select count(*) as n from "{topic}" where amount >= ? and customer = ?'
        cur.execute(sql, (30.0, "c1"))
        first = cur.fetch_arrow_table().to_pylist()
        cur.execute(sql, (0.0, "c2"))
        second = cur.fetch_arrow_table().to_pylist()
        # A '?' inside a literal is text, not a parameter.
        cur.execute(
            f"select count(*) as n from \"{topic}\" where customer <> '?' and amount < ?", (3.0,)
        )
        third = cur.fetch_arrow_table().to_pylist()
        # executemany is an update in ADBC: refused, naming the way to write.
        with pytest.raises(Error, match="append-only"):
            cur.executemany(sql, [(1.0, "c1"), (2.0, "c2")])
    # Several rows of parameters in one bind are refused, naming the way out.
    client = fl.connect(gw.flight_url)
    create = pack(M["ActionCreatePreparedStatementRequest"](query=sql))
    (result,) = client.do_action(fl.Action("CreatePreparedStatement", create))
    prepared = M["ActionCreatePreparedStatementResult"]()
    from google.protobuf import any_pb2

    any_pb2.Any.FromString(result.body.to_pybytes()).Unpack(prepared)
    bind = pack(
        M["CommandPreparedStatementQuery"](
            prepared_statement_handle=prepared.prepared_statement_handle
        )
    )
    rows = pa.table({"a": [1.0, 2.0], "b": ["c1", "c2"]})
    writer, _ = client.do_put(fl.FlightDescriptor.for_command(bind), rows.schema)
    writer.write_table(rows)
    with pytest.raises(pa.ArrowInvalid, match="exactly one row"):
        writer.close()
    c1 = [o for o in ORDERS if o["customer"] == "c1"]
    assert first == [{"n": sum(1 for o in c1 if o["amount"] >= 30)}]
    assert second == [{"n": sum(1 for o in ORDERS if o["customer"] == "c2")}]
    assert third == [{"n": 3}]


def test_get_objects_lists_topics_and_columns(orders: tuple[RunningGateway, str]) -> None:
    gw, topic = orders
    with _connect(gw) as conn:
        objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
        info = conn.adbc_get_info()
        schema = conn.adbc_get_table_schema(topic, db_schema_filter="raw")
    assert [c["catalog_name"] for c in objects] == ["thalweg"]
    schemas = {s["db_schema_name"]: s["db_schema_tables"] for s in objects[0]["catalog_db_schemas"]}
    assert set(schemas) == {"decoded", "raw", "dlq", "latest"}
    decoded = {t["table_name"]: t for t in schemas["decoded"]}
    assert [t["table_name"] for t in schemas["latest"]] == [topic]  # a keyed view of it
    columns = [c["column_name"] for c in decoded[topic]["table_columns"]]
    assert columns[:3] == ["customer", "amount", "note"]
    assert "_twg_source_partition" in columns and "_twg_source_offset" in columns
    assert "_twg_source_value" in schema.names
    assert info["vendor_name"] == "Thalweg"
    assert info["vendor_arrow_version"] == pa.__version__


def test_ingest_into_a_topic_then_read_back(orders: tuple[RunningGateway, str]) -> None:
    gw, topic = orders
    rows = pa.table({"customer": ["new1", "new2"], "amount": [1000.0, 2000.0]})
    with _connect(gw) as conn, conn.cursor() as cur:
        assert cur.adbc_ingest(topic, rows, mode="append") == 2
        with pytest.raises(Error) as refused:
            cur.adbc_ingest(topic, rows, mode="replace")
        assert refused.value.status_code == AdbcStatusCode.NOT_IMPLEMENTED
    q = f"select customer, amount from \"{topic}\" where customer like 'new%' order by 1"

    def landed() -> bool:
        with _connect(gw) as conn, conn.cursor() as cur:
            cur.execute(q)
            return len(cur.fetch_arrow_table()) == 2

    wait_until(landed, 30, "ingested rows readable")
    with _connect(gw) as conn, conn.cursor() as cur:
        cur.execute(q)
        assert cur.fetch_arrow_table().to_pylist() == rows.to_pylist()


def test_bad_sql_and_updates_are_refused_clearly(orders: tuple[RunningGateway, str]) -> None:
    gw, topic = orders
    with _connect(gw) as conn, conn.cursor() as cur:
        with pytest.raises(Error) as bad:
            cur.execute("selec 1")
        assert bad.value.status_code == AdbcStatusCode.INVALID_ARGUMENT
        assert "Expected: an SQL statement, found: selec" in str(bad.value)
        with pytest.raises(Error) as column:
            cur.execute(f'select nope from "{topic}"')
        assert "nope" in str(column.value)
        with pytest.raises(Error) as update:
            cur.execute(f"insert into \"{topic}\" (customer) values ('x')")
        assert update.value.status_code == AdbcStatusCode.NOT_IMPLEMENTED
        assert "append-only" in str(update.value)
        with pytest.raises(Error) as copy:
            cur.execute(f"copy (select 1) to '{gw.data_dir}/escape.csv'")
        assert copy.value.status_code == AdbcStatusCode.NOT_IMPLEMENTED
    assert not (gw.data_dir / "escape.csv").exists()
    # A raw Flight client sending CommandStatementUpdate is refused the same way.
    client = fl.connect(gw.flight_url)
    update_cmd = pack(M["CommandStatementUpdate"](query="delete from x"))
    writer, _ = client.do_put(fl.FlightDescriptor.for_command(update_cmd), pa.schema([]))
    with pytest.raises(pa.ArrowNotImplementedError, match="append-only"):
        writer.close()


def test_results_go_to_duckdb_and_pandas(orders: tuple[RunningGateway, str]) -> None:
    gw, topic = orders
    with _connect(gw) as conn, conn.cursor() as cur:
        cur.execute(f'select customer, amount, _twg_source_offset from "{topic}"')
        table = cur.fetch_arrow_table()
        cur.execute(f'select customer, amount from "{topic}" where amount < 5 order by amount')
        frame = cur.fetch_df()
    assert frame["amount"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    db = duckdb.connect()
    db.register("orders", table)
    top = db.sql("select customer, count(*) n from orders group by 1 order by 1").fetchall()
    assert top == [(f"c{i}", 12) for i in range(5)]


def test_a_table_the_caller_may_not_read_does_not_exist(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    public, secret = topic_factory(1, prefix="pub"), topic_factory(1, prefix="sec")
    for t in (public, secret):
        producer.produce(t, b'{"a": 1}', partition=0)
    producer.flush(10)
    users = [{"name": "ana", "password": "ana-password-1", "read": ["pub-*"]}]
    gw = gateway_factory([public, secret], gateway={"auth": {"tokens": TOKENS, "users": users}})
    gw.wait_durable(public, {0: 1})
    gw.wait_durable(secret, {0: 1})
    with _connect(gw, READER) as conn, conn.cursor() as cur:
        cur.execute(f'select a from "{public}"')
        assert cur.fetch_arrow_table().to_pylist() == [{"a": 1}]
        errors = {}
        for name in (secret, "sec-never-was"):
            with pytest.raises(Error) as refused:
                cur.execute(f'select a from raw."{name}"')
            errors[name] = refused.value
        listed = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
    assert all(e.status_code == AdbcStatusCode.NOT_FOUND for e in errors.values())
    assert str(errors[secret]).replace(secret, "X") == str(errors["sec-never-was"]).replace(
        "sec-never-was", "X"
    )
    names = {
        t["table_name"]
        for s in listed[0]["catalog_db_schemas"]
        for t in s["db_schema_tables"] or []
    }
    assert public in names and secret not in names
    with _connect(gw) as conn, conn.cursor() as cur, pytest.raises(Error) as anonymous:
        cur.execute("select 1")
    assert anonymous.value.status_code == AdbcStatusCode.UNAUTHENTICATED
    # Basic sign-in (user and password, answered with a session token): the same rights.
    signed_in = {"username": "ana", "password": "ana-password-1"}
    with (
        flight_sql.connect(gw.flight_url, db_kwargs=signed_in, autocommit=True) as conn,
        conn.cursor() as cur,
    ):
        assert _run(cur, f'select a from "{public}"').to_pylist() == [{"a": 1}]
        with pytest.raises(Error) as hidden:
            _run(cur, f'select a from raw."{secret}"')
        assert hidden.value.status_code == AdbcStatusCode.NOT_FOUND
    wrong = {"username": "ana", "password": "not-her-password"}
    with (
        pytest.raises(Error) as refused_sign_in,
        flight_sql.connect(gw.flight_url, db_kwargs=wrong, autocommit=True) as conn,
        conn.cursor() as cur,
    ):
        _run(cur, "select 1")
    assert refused_sign_in.value.status_code == AdbcStatusCode.UNAUTHENTICATED


def test_live_rows_are_in_the_result(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    broker: TansuBroker,
) -> None:
    topic = topic_factory(1)
    # Segments roll only after a minute: the rows are in the live tail, not on disk.
    gw = gateway_factory([topic], raw_lane={"roll_age_s": 60, "roll_rows": 1_000_000})
    produce_json(broker.bootstrap, topic, ORDERS[:7], producer=producer)
    catalog = gw.gateway.catalog

    def fetched() -> bool:
        state = catalog.live.state(topic, 0)
        return state is not None and (state.high_water or 0) >= 7

    wait_until(fetched, 30, "records fetched")
    with _connect(gw) as conn, conn.cursor() as cur:
        cur.execute(f'select amount from "{topic}" order by 1')
        got = cur.fetch_arrow_table().column("amount").to_pylist()
        cur.execute(f'select count(*) as n from raw."{topic}"')
        raw = cur.fetch_arrow_table().to_pylist()
    assert catalog.durable_end(topic, 0) == 0, "the premise: nothing durable yet"
    assert got == [o["amount"] for o in ORDERS[:7]]
    assert raw == [{"n": 7}]


def test_limits_memory_time_and_cancel(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    broker: TansuBroker,
) -> None:
    topic = topic_factory(1)
    produce_json(broker.bootstrap, topic, ORDERS, producer=producer)
    sql_cfg = {"memory_limit_bytes": 2 * 1024 * 1024, "timeout_s": 1.0}
    gw = gateway_factory([topic], gateway={"flight": {"sql": sql_cfg}})
    gw.wait_durable(topic, {0: 60})
    t = f'"{topic}"'
    huge = f"select a.amount from {t} a, {t} b, {t} c, {t} d, {t} e"
    with _connect(gw) as conn, conn.cursor() as cur:
        # Memory: a sort of 216 k wide rows does not fit in 2 MiB.
        big_sort = (
            f"select a.note, b.customer, c.amount, repeat(a.customer, 50) s from {t} a, "
            f"{t} b, {t} c order by s, c.amount desc"
        )
        with pytest.raises(Error, match="memory_limit_bytes"):
            _run(cur, big_sort)
        # Time: a 778 M-row cross join streams for far longer than a second.
        with pytest.raises(Error, match="timeout_s") as slow:
            _run(cur, huge)
        assert slow.value.status_code == AdbcStatusCode.TIMEOUT
    engine = gw.gateway.flight.sql.engine
    wait_until(lambda: engine.active == 0, 10, "timed-out query ended")
    # Cancel: a client reads one batch of the same query and cancels; the scan stops.
    client = fl.connect(gw.flight_url)
    cmd = pack(M["CommandStatementQuery"](query=huge))
    info = client.get_flight_info(fl.FlightDescriptor.for_command(cmd))
    reader = client.do_get(info.endpoints[0].ticket)
    reader.read_chunk()
    assert engine.active == 1
    reader.cancel()
    wait_until(lambda: engine.active == 0, 10, "cancelled query ended")
    assert not list((gw.data_dir / "sql-snapshots").iterdir()), "snapshot links removed"


def test_segments_removed_mid_query_stay_readable(orders: tuple[RunningGateway, str]) -> None:
    """A query holds its files: deleting a segment after it started loses nothing."""
    gw, topic = orders
    client = fl.connect(gw.flight_url)
    # Sorted: one endpoint, one snapshot (each endpoint of a split query takes its own).
    cmd = pack(M["CommandStatementQuery"](query=f'select amount from "{topic}" order by 1'))
    info = client.get_flight_info(fl.FlightDescriptor.for_command(cmd))
    started = threading.Event()
    engine = gw.gateway.flight.sql.engine
    real = engine._tables.snapshot

    def snapshot_then_delete():  # type: ignore[no-untyped-def]
        snap = real()
        frame = snap.frame

        def frame_then_delete(*args, **kwargs):  # type: ignore[no-untyped-def]
            out = frame(*args, **kwargs)
            for f in (gw.data_dir / "decoded").rglob("*.parquet"):
                f.unlink()  # what retention does once the floor passes a segment
            started.set()
            return out

        snap.frame = frame_then_delete  # type: ignore[method-assign]
        return snap

    engine._tables.snapshot = snapshot_then_delete  # type: ignore[method-assign]
    assert len(info.endpoints) == 1
    got = client.do_get(info.endpoints[0].ticket).read_all()
    assert started.is_set()
    assert sorted(got.column("amount").to_pylist()) == sorted(o["amount"] for o in ORDERS)


def test_sql_off_is_refused(
    topic_factory: Callable[..., str], gateway_factory: Callable[..., RunningGateway]
) -> None:
    topic = topic_factory(1)
    gw = gateway_factory([topic], gateway={"flight": {"sql": {"enabled": False}}})
    client = fl.connect(gw.flight_url)
    cmd = pack(M["CommandStatementQuery"](query="select 1"))
    with pytest.raises(pa.ArrowNotImplementedError, match="Flight SQL is off"):
        client.get_flight_info(fl.FlightDescriptor.for_command(cmd))
    # The JSON ticket path is untouched.
    with thalweg_client.connect(gw.flight_url) as c:
        assert topic in c.topics()


def test_filters_select_segments_and_row_wise_queries_split_by_partition(
    orders: tuple[RunningGateway, str],
) -> None:
    gw, topic = orders
    engine = gw.gateway.flight.sql.engine
    client = fl.connect(gw.flight_url)

    def info(sql: str) -> fl.FlightInfo:
        cmd = pack(M["CommandStatementQuery"](query=sql))
        return client.get_flight_info(fl.FlightDescriptor.for_command(cmd))

    def read(sql: str) -> tuple[pa.Table, int]:
        before = engine.segments_read
        tables = [client.do_get(e.ticket).read_all() for e in info(sql).endpoints]
        return pa.concat_tables(tables), engine.segments_read - before

    def segments(partition: int) -> list[Path]:
        return sorted((gw.data_dir / "decoded").glob(f"topic=*/partition={partition}/*.parquet"))

    t = f'"{topic}"'
    # Row by row over two partitions: an endpoint each; anything else: one.
    assert len(info(f"select amount from {t} where amount > 3").endpoints) == 2
    assert len(info(f"select count(*) from {t}").endpoints) == 1
    assert len(info(f"select amount from {t} order by 1").endpoints) == 1
    assert len(info(f"select amount from {t} where _twg_source_partition = 0").endpoints) == 1
    everything, linked = read(f"select amount from {t}")
    assert everything.num_rows == 60 and linked == len(segments(0)) + len(segments(1))
    # Partition filters, also as IN lists, read only that partition's segments.
    one, linked = read(f"select amount from {t} where _twg_source_partition = 1")
    assert sorted(one.column("amount").to_pylist()) == [o["amount"] for o in ORDERS[1::2]]
    assert linked == len(segments(1))
    inlist, linked = read(f"select amount from {t} where _twg_source_partition in (1, 7)")
    assert inlist.num_rows == 30 and linked == len(segments(1))
    # Position bounds skip the segments wholly outside them.
    first = segments(0)[0]
    lo, hi = (int(x) for x in first.stem.split("-")[:2])
    bounded, linked = read(
        f"select _twg_position from {t} where _twg_source_partition = 0 and _twg_position <= {hi}"
    )
    assert sorted(bounded.column(0).to_pylist()) == list(range(lo, hi + 1))
    assert linked == 1
    # A timestamp bound after every record selects no segment, and no row.
    late, linked = read(
        f"select * from raw.{t} where _twg_source_timestamp > now() + interval '1 day'"
    )
    assert late.num_rows == 0 and linked == 0
