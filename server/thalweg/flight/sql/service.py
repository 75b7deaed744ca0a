"""The Flight SQL verbs: which command a descriptor, ticket or action carries, and its
answer.

* ``GetFlightInfo`` / ``GetSchema`` — a query (``CommandStatementQuery``, a bound
  ``CommandPreparedStatementQuery``) is planned, not run: its schema, and one endpoint
  whose ticket is a ``TicketStatementQuery`` carrying the statement handle; a catalog
  command's endpoint ticket is the command itself.
* ``DoGet`` — runs the query of the ticket (or answers the catalog command).
* ``DoPut`` — binds parameters (``CommandPreparedStatementQuery``: the reply carries
  the new handle) or ingests (``CommandStatementIngest``: produces into the topic
  through ``do_put``'s path and answers the row count). Updates are refused.
* ``DoAction`` — ``CreatePreparedStatement``, ``ClosePreparedStatement``.

Rights are checked on every call with the caller of that call: a handle or ticket grants
nothing by itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
from google.protobuf.message import Message

from thalweg.flight.auth import caller_key, principal_of
from thalweg.flight.errors import InvalidArgumentError, UnimplementedError, refusing
from thalweg.flight.limits import StreamLimiter
from thalweg.flight.put.service import Puts
from thalweg.flight.sql import metadata as md
from thalweg.flight.sql.engine import PlannedQuery, SqlEngine
from thalweg.flight.sql.handles import Statement
from thalweg.flight.sql.messages import M, pack, unpack
from thalweg.ops.metrics import Metrics

ACTIONS = {
    "CreatePreparedStatement": "Flight SQL: plan a query; the handle carries it.",
    "ClosePreparedStatement": "Flight SQL: nothing to free (handles hold no server state).",
}

_UPDATES = {"CommandStatementUpdate", "CommandPreparedStatementUpdate"}
_KEYS = {
    "CommandGetPrimaryKeys": md.PRIMARY_KEYS_SCHEMA,
    "CommandGetExportedKeys": md.FOREIGN_KEYS_SCHEMA,
    "CommandGetImportedKeys": md.FOREIGN_KEYS_SCHEMA,
    "CommandGetCrossReference": md.FOREIGN_KEYS_SCHEMA,
}
_INGEST = M["CommandStatementIngest"].TableDefinitionOptions


class FlightSql:
    """Serves Flight SQL on the gateway's Flight server."""

    def __init__(
        self, engine: SqlEngine, puts: Puts, metrics: Metrics, streams: StreamLimiter
    ) -> None:
        self.engine = engine
        self._puts = puts
        self._metrics = metrics
        self._streams = streams

    # -- GetFlightInfo / GetSchema ---------------------------------------------------

    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        command = descriptor.command
        name, msg = _command(command)
        planned = self._query(context, name, msg)
        if planned is None:
            schema = self._metadata_schema(name, msg)
            return fl.FlightInfo(schema, descriptor, [fl.FlightEndpoint(command, [])], -1, -1)
        return fl.FlightInfo(planned.schema, descriptor, self._endpoints(planned), -1, -1)

    def _endpoints(self, planned: PlannedQuery) -> list[fl.FlightEndpoint]:
        """One endpoint per partition for a row-wise query of a table with several (the
        client reads them in parallel), else one. Locations are left empty: Flight SQL
        clients then read from this same server."""
        statement = planned.statement
        shares: list[tuple[int, ...] | None] = [None]
        if planned.row_wise and statement.partitions is None:
            parts = self.engine.partitions(planned)
            if len(parts) > 1:
                shares = [(p,) for p in parts]
        out = []
        for share in shares:
            handle = Statement(statement.sql, statement.params, share).encode()
            ticket = pack(M["TicketStatementQuery"](statement_handle=handle))
            out.append(fl.FlightEndpoint(ticket, []))
        return out

    def get_schema(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.SchemaResult:
        name, msg = _command(descriptor.command)
        planned = self._query(context, name, msg)
        return fl.SchemaResult(
            planned.schema if planned is not None else self._metadata_schema(name, msg)
        )

    # -- DoGet ---------------------------------------------------------------------------

    def do_get(self, context: fl.ServerCallContext, ticket: bytes) -> fl.FlightDataStream:
        name, msg = _command(ticket)
        if name != "TicketStatementQuery":
            return fl.RecordBatchStream(self._metadata(context, name, msg))
        planned = self._plan(context, Statement.decode(msg.statement_handle))
        slot = self._streams.acquire(caller_key(context))
        rows = self._metrics.flight_rows.labels("do_get")
        sent = self._metrics.flight_bytes.labels("do_get")

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                for batch in self.engine.run(planned, lambda: bool(context.is_cancelled())):
                    rows.inc(batch.num_rows)
                    sent.inc(batch.nbytes)
                    yield batch
            finally:
                slot.release()

        gen = batches()
        weakref.finalize(gen, slot.release)  # a call cancelled before its first batch
        return fl.GeneratorStream(planned.schema, refusing(gen, "do_get"))

    # -- DoPut ---------------------------------------------------------------------------

    def do_put(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> None:
        name, msg = _command(descriptor.command)
        if name == "CommandPreparedStatementQuery":
            statement = Statement.decode(msg.prepared_statement_handle)
            bound = Statement(statement.sql, _one_row(reader))
            self._plan(context, bound)  # a bad binding is refused now, not at DoGet
            result = M["DoPutPreparedStatementResult"](prepared_statement_handle=bound.encode())
            writer.write(pa.py_buffer(result.SerializeToString()))
            return
        if name == "CommandStatementIngest":
            topic = _ingest_topic(msg)
            rows = self._puts.do_put(
                context, fl.FlightDescriptor.for_path("topics", topic), reader, _Quiet()
            )
            result = M["DoPutUpdateResult"](record_count=rows)
            writer.write(pa.py_buffer(result.SerializeToString()))
            return
        if name in _UPDATES:
            raise UnimplementedError(
                "updates are not served: topics are append-only (ingest rows with "
                "CommandStatementIngest, e.g. adbc_ingest(mode='append'))"
            )
        raise InvalidArgumentError(f"{name} is not a DoPut command")

    # -- DoAction ------------------------------------------------------------------------

    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[bytes]:
        body = action.body.to_pybytes()
        if action.type == "ClosePreparedStatement":
            _command(body)  # well-formed, or refused; there is nothing to free
            return
        if action.type != "CreatePreparedStatement":
            raise UnimplementedError(
                f"Flight SQL action {action.type!r} is not served (no transactions, no "
                "Substrait, no cancel action: cancel the DoGet call)"
            )
        name, msg = _command(body)
        if name != "ActionCreatePreparedStatementRequest":
            raise InvalidArgumentError(f"CreatePreparedStatement takes a request, not {name}")
        _no_transaction(msg)
        planned = self._plan(context, Statement(msg.query))
        result = M["ActionCreatePreparedStatementResult"](
            prepared_statement_handle=planned.statement.encode(),
            dataset_schema=planned.schema.serialize().to_pybytes(),
            parameter_schema=b"",  # types are the values' own when bound
        )
        yield pack(result)

    # -- helpers -------------------------------------------------------------------------

    def _plan(self, context: fl.ServerCallContext, statement: Statement) -> PlannedQuery:
        caller = principal_of(context)
        return self.engine.plan(statement, lambda topic: caller.may("read", topic))

    def _query(self, context: fl.ServerCallContext, name: str, msg: Any) -> PlannedQuery | None:
        """The planned query of a query command; None for a catalog command."""
        if name == "CommandStatementQuery":
            _no_transaction(msg)
            return self._plan(context, Statement(msg.query))
        if name == "CommandPreparedStatementQuery":
            return self._plan(context, Statement.decode(msg.prepared_statement_handle))
        if name == "CommandStatementSubstraitPlan":
            raise UnimplementedError("Substrait plans are not served; send SQL")
        if name in _UPDATES:
            raise UnimplementedError("updates are not served: topics are append-only")
        return None

    def _metadata_schema(self, name: str, msg: Any) -> pa.Schema:
        if name == "CommandGetSqlInfo":
            return md.SQL_INFO_SCHEMA
        if name == "CommandGetCatalogs":
            return md.CATALOGS_SCHEMA
        if name == "CommandGetDbSchemas":
            return md.DB_SCHEMAS_SCHEMA
        if name == "CommandGetTables":
            return md.TABLES_WITH_SCHEMA if msg.include_schema else md.TABLES_SCHEMA
        if name == "CommandGetTableTypes":
            return md.TABLE_TYPES_SCHEMA
        if name in _KEYS:
            return _KEYS[name]
        if name == "CommandGetXdbcTypeInfo":
            raise UnimplementedError("CommandGetXdbcTypeInfo is not served")
        raise InvalidArgumentError(f"{name} is not a GetFlightInfo command")

    def _metadata(self, context: fl.ServerCallContext, name: str, msg: Any) -> pa.Table:
        """The rows of a catalog command, for this caller."""
        schema = self._metadata_schema(name, msg)
        if name == "CommandGetSqlInfo":
            return md.sql_info(list(msg.info))
        if name == "CommandGetCatalogs":
            return md.catalogs()
        if name == "CommandGetDbSchemas":
            return md.db_schemas(
                self.engine.schema_names(),
                _opt(msg, "catalog"),
                _opt(msg, "db_schema_filter_pattern"),
            )
        if name == "CommandGetTables":
            caller = principal_of(context)
            return md.tables(
                self.engine.entries(lambda topic: caller.may("read", topic)),
                catalog=_opt(msg, "catalog"),
                schema_pattern=_opt(msg, "db_schema_filter_pattern"),
                table_pattern=_opt(msg, "table_name_filter_pattern"),
                table_types=list(msg.table_types),
                include_schema=msg.include_schema,
            )
        if name == "CommandGetTableTypes":
            return md.table_types()
        return schema.empty_table()  # keys: topics have none


def _one_row(reader: fl.MetadataRecordBatchReader) -> pa.RecordBatch | None:
    """The one row of parameters a bind sends (None for none), read batch by batch so a
    client sending many rows is refused before they are all in memory."""
    found: pa.RecordBatch | None = None
    while True:
        try:
            chunk = reader.read_chunk().data
        except StopIteration:
            return found
        if chunk is None or not chunk.num_rows:
            continue
        if found is not None or chunk.num_rows > 1:
            raise InvalidArgumentError(
                "bind exactly one row of parameters; run the statement once per row"
            )
        found = chunk


class _Quiet:
    """A metadata writer that drops ``do_put``'s per-batch acknowledgements: an ingest
    answers once, with ``DoPutUpdateResult``."""

    def write(self, _buf: pa.Buffer) -> None:
        return None


def _command(data: bytes) -> tuple[str, Any]:
    try:
        return unpack(data)
    except LookupError as exc:
        raise UnimplementedError(f"Flight SQL command {exc.args[0]} is not served") from exc
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc


def _opt(msg: Message, field: str) -> str | None:
    return getattr(msg, field) if msg.HasField(field) else None


def _no_transaction(msg: Message) -> None:
    if msg.HasField("transaction_id"):
        raise UnimplementedError("transactions are not served: run the statement without one")


def _ingest_topic(msg: Any) -> str:
    """The topic an ingest appends to; what it cannot do is refused, naming why."""
    _no_transaction(msg)
    if msg.temporary:
        raise UnimplementedError("temporary tables are not served: ingest appends to a topic")
    if msg.HasField("catalog") and msg.catalog != md.CATALOG:
        raise InvalidArgumentError(f"unknown catalog {msg.catalog!r} (the only one: thalweg)")
    if msg.HasField("schema") and msg.schema not in ("decoded", "raw"):
        raise InvalidArgumentError(
            f"ingest into schema 'decoded' (payload columns) or 'raw' (a value column), "
            f"not {msg.schema!r}"
        )
    opts = msg.table_definition_options
    if opts.if_exists in (_INGEST.TABLE_EXISTS_OPTION_FAIL, _INGEST.TABLE_EXISTS_OPTION_REPLACE):
        raise UnimplementedError(
            "a topic is appended to, never created or replaced by an ingest: use "
            "mode='append' (topics are created on the broker)"
        )
    if not msg.table:
        raise InvalidArgumentError("ingest names no table (the topic)")
    return str(msg.table)
