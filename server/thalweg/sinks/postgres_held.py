"""What a Postgres sink's tables hold, read back in one connection (``Sink.holds``).

Its rows of the coverage table (``_thalweg_coverage``, written in the same transaction
as the data) and the locator columns of every table it writes — each table a routed
template named. Read-only: a table or schema that is not there holds nothing.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import adbc_driver_postgresql.dbapi as pg
import pyarrow as pa

from thalweg.sinks.base import Ranges
from thalweg.sinks.contract import Held
from thalweg.sinks.postgres import COVERAGE_TABLE, quote_ident

if TYPE_CHECKING:
    from thalweg.sinks.postgres import PostgresSink


def read_held(sink: PostgresSink, wanted: list[str]) -> Held:
    """The coverage table's rows of this sink, and the ``wanted`` columns of each
    table it writes (every table a routed template named), read in one connection."""
    schema = sink.cfg.schema_name
    with pg.connect(sink.cfg.dsn.get_secret_value()) as conn, conn.cursor() as cur:

        def exists(table: str) -> bool:
            cur.execute(
                "SELECT count(*) FROM information_schema.tables "
                "WHERE table_schema = $1 AND table_name = $2",
                parameters=(schema, table),
            )
            row = cur.fetchone()
            return bool(row and row[0])

        coverage: Ranges = {}
        if exists(COVERAGE_TABLE):
            cur.execute(
                f"SELECT topic, partition, epoch, ranges::text FROM "
                f"{quote_ident(schema)}.{quote_ident(COVERAGE_TABLE)} WHERE sink = $1",
                parameters=(sink.name,),
            )
            for topic, partition, epoch, text in cur.fetchall():
                coverage[(topic, int(partition), int(epoch))] = [
                    (int(a), int(b)) for a, b in json.loads(text)
                ]
        rows: dict[str, pa.Table | None] = {}
        for topic in sink.cfg.topics:
            found = [t for t in sink.tables_of(cur, topic) if exists(t)]
            parts = []
            for table in found:
                cur.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = $1 AND table_name = $2",
                    parameters=(schema, table),
                )
                there = {str(r[0]) for r in cur.fetchall()}
                cols = ", ".join(quote_ident(c) for c in wanted if c in there)
                cur.execute(f"SELECT {cols} FROM {quote_ident(schema)}.{quote_ident(table)}")
                parts.append(cur.fetch_arrow_table())
            rows[topic] = pa.concat_tables(parts, promote_options="permissive") if parts else None
    return Held(coverage, rows)
