"""Plan and run SQL over the lanes with DataFusion.

A query is planned twice, cheaply then for real:

1. **Planning** sees every table the caller may read as an empty table of the right
   schema (nothing is read). It checks the SQL, gives the result schema (for
   ``GetFlightInfo``, ``GetSchema``, a prepared statement) and learns which tables the
   query names. A table the caller may not read does not exist here, so the planner's
   "not found" is the same for it as for a topic that never was.
2. **Running** snapshots only those tables (``tables.Snapshot``), plans again against
   the snapshot, and streams DataFusion's batches, in a session with its own memory
   pool (``gateway.flight.sql.memory_limit_bytes``).

DataFusion runs the query on its own threads and releases the GIL while it does; the
gRPC thread only hands batches on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
from datafusion import RuntimeEnvBuilder, SessionConfig, SessionContext, SQLOptions
from datafusion.catalog import Schema, SchemaProvider, Table

from thalweg.config.models import FlightSqlConfig
from thalweg.flight.errors import (
    InvalidArgumentError,
    NotFoundError,
    RefusalError,
    ServerFailedError,
    TimedOutError,
    UnavailableError,
    UnimplementedError,
)
from thalweg.flight.sql.handles import Statement
from thalweg.flight.sql.metadata import CATALOG, DEFAULT_SCHEMA, TableEntry
from thalweg.flight.sql.placeholders import number_markers
from thalweg.flight.sql.selection import EVERYTHING, Selection, row_wise, selections
from thalweg.flight.sql.tables import LANES, LATEST, NODES, LaneTables

log = logging.getLogger(__name__)

MIN_BATCH_ROWS = 64 * 1024
MIN_BATCH_BYTES = 4 * 1024 * 1024
MAX_HOLD_S = 0.1
# Queries only: no INSERT/COPY (COPY would write files on the gateway), no CREATE, no SET.
READ_ONLY = SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    """A checked query: its result schema and the tables it reads."""

    statement: Statement
    sql: str  # with ``?`` markers numbered
    schema: pa.Schema
    tables: dict[tuple[str, str], pa.Schema]  # (lane schema, topic) → table schema
    markers: int
    selections: dict[tuple[str, str], Selection]
    row_wise: bool  # one table, scans/filters/projections: splittable by partition


class _Planning(SchemaProvider):
    """One lane schema at planning time: empty tables, and a note of each one used."""

    def __init__(self, name: str, tables: dict[str, pa.Schema], used: set[tuple[str, str]]):
        self._name = name
        self._tables = tables
        self._used = used

    @property  # DataFusion 55 reads it as an attribute, not a method
    def table_names(self) -> set[str]:  # type: ignore[override]
        return set(self._tables)

    def table(self, name: str) -> Table | None:
        schema = self._tables.get(name)
        if schema is None:
            return None
        self._used.add((self._name, name))
        return Table(ds.dataset(schema.empty_table()))

    def table_exist(self, name: str) -> bool:
        return name in self._tables


class SqlEngine:
    """Plans and runs the queries of every caller; one instance per gateway."""

    def __init__(self, tables: LaneTables, cfg: FlightSqlConfig) -> None:
        self._tables = tables
        self._cfg = cfg
        self._running = threading.BoundedSemaphore(cfg.max_queries)
        self.active = 0  # queries running now (tests and /stats read it)
        self.segments_read = 0  # segment files queries linked (what selections left)
        self._lock = threading.Lock()
        tables.sweep()

    def entries(self, may_read: Callable[[str], bool]) -> list[TableEntry]:
        return self._tables.entries(may_read)

    def schema_names(self) -> list[str]:
        return self._tables.schema_names()

    def plan(self, statement: Statement, may_read: Callable[[str], bool]) -> PlannedQuery:
        """Check ``statement`` for a caller and give its result schema; reads nothing.

        Raises:
            NotFoundError: a table that does not exist (or the caller may not read).
            InvalidArgumentError: anything else the parser or planner refuses.
        """
        sql, markers = number_markers(statement.sql)
        by_schema: dict[str, dict[str, pa.Schema]] = {
            name: {} for name in self._tables.schema_names()
        }
        for e in self._tables.entries(may_read):
            by_schema[e.db_schema][e.name] = e.schema
        used: set[tuple[str, str]] = set()
        ctx = self._context(None)
        for name, named in by_schema.items():
            ctx.catalog(CATALOG).register_schema(name, _Planning(name, named, used))
        try:
            params = self._params(statement, markers, planning=True)
            df = ctx.sql(sql, options=READ_ONLY, param_values=params)
            schema = df.schema()
            plan = df.optimized_logical_plan()
        except Exception as exc:
            raise sql_error(exc, self._cfg) from exc
        tables = {key: by_schema[key[0]][key[1]] for key in sorted(used)}
        chosen = selections(plan, self._tables.columns)
        return PlannedQuery(
            statement, sql, schema, tables, markers, chosen, row_wise(plan) and len(tables) == 1
        )

    def partitions(self, query: PlannedQuery) -> list[int]:
        """The partitions the one table of a row-wise query reads (after its selection)."""
        ((name, topic),) = query.tables
        sel = query.selections.get((name, topic), EVERYTHING)
        return [p for p in self._tables.partitions(topic) if sel.keeps_partition(p)]

    def run(self, query: PlannedQuery, cancelled: Callable[[], bool]) -> Iterator[pa.RecordBatch]:
        """The query's result batches, read from a snapshot taken now.

        Raises (while iterated):
            UnavailableError: ``max_queries`` are running.
            TimedOutError: past ``timeout_s`` (checked between batches).
        """
        if not self._running.acquire(blocking=False):
            raise UnavailableError(
                f"{self._cfg.max_queries} queries are running "
                "(gateway.flight.sql.max_queries); retry shortly"
            )
        deadline = time.monotonic() + self._cfg.timeout_s
        snapshot = self._tables.snapshot()
        with self._lock:
            self.active += 1
        try:
            try:
                ctx = self._context(self._cfg.memory_limit_bytes)
                for name in self._tables.schema_names():
                    if name != DEFAULT_SCHEMA:
                        ctx.catalog(CATALOG).register_schema(name, Schema.memory_schema())
                share = query.statement.partitions
                for (name, topic), schema in query.tables.items():
                    sel = query.selections.get((name, topic), EVERYTHING)
                    if share is not None:
                        sel = sel.only(frozenset(share))
                    if name == NODES:
                        frame = snapshot.node_frame(ctx, topic, schema, sel)
                    elif name == LATEST:
                        frame = snapshot.latest_frame(ctx, topic, schema, sel)
                    else:
                        frame = snapshot.frame(ctx, LANES[name], topic, schema, sel)
                    ctx.catalog(CATALOG).schema(name).register_table(topic, Table(frame))
                with self._lock:
                    self.segments_read += snapshot.segments_read
                params = self._params(query.statement, query.markers, planning=False)
                df = ctx.sql(query.sql, options=READ_ONLY, param_values=params)
                batches = (b.to_pyarrow() for b in df.execute_stream())
                for batch in coalesced(batches):
                    yield batch if batch.schema == query.schema else batch.cast(query.schema)
                    if cancelled():
                        return
                    if time.monotonic() > deadline:
                        raise TimedOutError(
                            f"the query ran longer than gateway.flight.sql.timeout_s "
                            f"({self._cfg.timeout_s:g} s)"
                        )
            except RefusalError:
                raise
            except Exception as exc:
                raise sql_error(exc, self._cfg) from exc
        finally:
            # The snapshot goes before the count: a reader of ``active`` (``/stats``, a
            # test) that sees 0 may take it that no query still holds lane files.
            try:
                snapshot.close()
            finally:
                with self._lock:
                    self.active -= 1
                self._running.release()

    def _context(self, memory: int | None) -> SessionContext:
        config = SessionConfig().with_default_catalog_and_schema(CATALOG, DEFAULT_SCHEMA)
        if self._cfg.target_partitions is not None:
            config = config.with_target_partitions(self._cfg.target_partitions)
        runtime = RuntimeEnvBuilder()
        if memory is not None:
            runtime = runtime.with_greedy_memory_pool(memory)
        return SessionContext(config, runtime)

    def _params(
        self, statement: Statement, markers: int, *, planning: bool
    ) -> dict[str, Any] | None:
        """``$n`` → value from the bound one-row batch (by position). At planning time
        an unbound statement plans with nulls, so it can be prepared before binding."""
        params = statement.params
        if params is None:
            if not markers:
                return None
            if planning:
                return {str(i + 1): None for i in range(markers)}
            raise InvalidArgumentError(
                f"the statement has {markers} parameter(s) and none were bound"
            )
        if params.num_rows != 1:
            raise InvalidArgumentError(
                f"bind exactly one row of parameters (got {params.num_rows}); run the "
                "statement once per row"
            )
        return {str(i + 1): params.column(i)[0] for i in range(params.num_columns)}


def coalesced(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Batches of at least :data:`MIN_BATCH_ROWS` rows (or :data:`MIN_BATCH_BYTES`).

    Some operators emit tiny batches (a cross join: one per left row), and each batch
    costs a gRPC message and a client round of decoding: 30-row batches made a 13 M-row
    result take 140 s instead of seconds. A batch waits at most :data:`MAX_HOLD_S` for
    company, so a slow query still shows its first rows early.
    """
    held: list[pa.RecordBatch] = []
    rows = nbytes = 0
    since = 0.0
    for batch in batches:
        if not held:
            since = time.monotonic()
        held.append(batch)
        rows += batch.num_rows
        nbytes += batch.nbytes
        if (
            rows >= MIN_BATCH_ROWS
            or nbytes >= MIN_BATCH_BYTES
            or (time.monotonic() - since >= MAX_HOLD_S)
        ):
            yield _one(held)
            held, rows, nbytes = [], 0, 0
    if held:
        yield _one(held)


def _one(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """Batches of one schema as one batch (``pa.concat_batches`` needs pyarrow 19)."""
    if len(batches) == 1:
        return batches[0]
    combined = pa.Table.from_batches(batches).combine_chunks()
    return combined.to_batches()[0] if combined.num_rows else batches[0]


def sql_error(exc: Exception, cfg: FlightSqlConfig) -> RefusalError:
    """What a client is told about a DataFusion error: the planner's own message."""
    if isinstance(exc, RefusalError):
        return exc
    message = str(exc).removeprefix("DataFusion error: ")
    if isinstance(exc, FileNotFoundError):
        return UnavailableError("a segment was removed while the query started; retry")
    if "Resources exhausted" in message:
        return ServerFailedError(
            "the query needs more memory than gateway.flight.sql.memory_limit_bytes "
            f"({cfg.memory_limit_bytes} bytes) allows: {message}"
        )
    if any(f"{kind} not supported" in message for kind in ("DML", "DDL", "Statement")):
        return UnimplementedError(
            f"only queries are served: topics are append-only, and the session is fixed "
            f"({message}); ingest rows with CommandStatementIngest"
        )
    if "not found" in message and "table '" in message:
        return NotFoundError(message)
    if any(s in message for s in ("IO error", "Object Store error", "External error")):
        log.warning("flight sql: a query failed reading its files: %s", message)
        return UnavailableError(f"the query failed reading the lanes; retry ({message})")
    return InvalidArgumentError(message)
