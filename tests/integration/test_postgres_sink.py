"""The Postgres sink on its own, against a real server: the offsets table committed with
the rows and trusted on open, widened and added columns, a foreign key refused."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from tests.postgres_server import PostgresServer
from thalweg.config.sinks import PostgresSinkConfig
from thalweg.sinks.base import SinkSchemaError, SinkState, Span
from thalweg.sinks.postgres import PostgresSink

pytestmark = pytest.mark.integration


def rows(positions: list[int], n_type: pa.DataType | None = None) -> pa.Table:
    return pa.table(
        {
            "_twg_record_id": pa.array([p.to_bytes(16, "big") for p in positions], pa.binary(16)),
            "_twg_position": pa.array(positions, pa.int64()),
            "n": pa.array(positions, n_type or pa.int32()),
        }
    )


def sink(pg: PostgresServer, tmp_path: Path, schema: str) -> PostgresSink:
    cfg = PostgresSinkConfig(
        name="db", kind="postgres", topics=["orders"], dsn=pg.dsn, schema_name=schema
    )
    return PostgresSink(cfg, tmp_path)


def put(s: PostgresSink, table: pa.Table, start: int, end: int) -> None:
    async def go() -> None:
        await s.write(table, Span("orders", 0, 0, start, end))
        await s.flush()

    asyncio.run(go())


def test_widened_and_added_columns_and_the_offsets_table(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    schema = f"w_{uuid.uuid4().hex[:8]}"
    s = sink(postgres, tmp_path, schema)
    assert asyncio.run(s.open()) is not None
    put(s, rows([0, 1]), 0, 2)
    put(s, rows([2], pa.int64()).append_column("note", pa.array(["x"])), 2, 3)  # wider, new
    put(s, rows([3], pa.int16()), 3, 5)  # narrower fits; position 4 had no row
    kinds = dict(
        postgres.query(
            "SELECT column_name, data_type FROM information_schema.columns "
            f"WHERE table_schema = '{schema}' AND table_name = 'orders'"
        )
    )
    assert kinds["n"] == "bigint" and kinds["note"] == "text"
    got = postgres.query(f'SELECT n, note FROM "{schema}".orders ORDER BY n')
    assert got == [(0, None), (1, None), (2, "x"), (3, None)]
    landed = asyncio.run(sink(postgres, tmp_path, schema).open())
    assert landed is not None and landed.ranges == {("orders", 0, 0): [(0, 5)]}


def test_a_table_keyed_otherwise_is_refused_as_a_schema_error(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    schema = f"k_{uuid.uuid4().hex[:8]}"
    postgres.query(f'CREATE SCHEMA "{schema}"')
    postgres.query(
        f'CREATE TABLE "{schema}".orders (_twg_record_id bytea, _twg_position bigint '
        "PRIMARY KEY, n integer)"
    )
    s = sink(postgres, tmp_path, schema)
    asyncio.run(s.open())
    with pytest.raises(SinkSchemaError, match="primary key"):
        put(s, rows([0]), 0, 1)
    assert s.health().state is SinkState.DEGRADED
    assert postgres.query(f'SELECT count(*) FROM "{schema}".orders') == [(0,)]


def test_a_value_postgres_cannot_hold_degrades_the_sink_not_downs_it(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    schema = f"d_{uuid.uuid4().hex[:8]}"
    s = sink(postgres, tmp_path, schema)
    asyncio.run(s.open())
    bad = rows([0]).append_column("note", pa.array(["nul \x00 inside"]))
    with pytest.raises(SinkSchemaError):
        put(s, bad, 0, 1)
    assert s.health().state is SinkState.DEGRADED


def test_a_nodes_derived_rows_keep_one_row_each_not_one_per_record(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    schema = f"n_{uuid.uuid4().hex[:8]}"
    s = sink(postgres, tmp_path, schema)
    asyncio.run(s.open())
    # Record 0 unnested into three rows, record 1 into one: the key is (record id,
    # derived index), so all four land, and a replay of them adds nothing.
    derived = rows([0, 0, 0, 1]).append_column(
        "_twg_derived_index", pa.array([0, 1, 2, 0], pa.int32())
    )
    put(s, derived, 0, 2)
    s2 = sink(postgres, tmp_path, schema)
    asyncio.run(s2.open())
    put(s2, derived, 0, 2)  # a replay (the offsets table says covered, but staged anyway)
    got = postgres.query(f'SELECT "_twg_derived_index" FROM "{schema}".orders ORDER BY 1')
    assert len(got) == 4
