"""The gateway's Flight server: it authenticates, limits and dispatches, nothing more.

Each verb's body lives with its kind of work: reads (``list_flights``,
``get_flight_info``, ``get_schema``, ``do_get``, ``describe-topic``) in
:class:`~thalweg.flight.read.service.Reads`, writes (``do_put``) in
:class:`~thalweg.flight.put.service.Puts`, Flight SQL (commands, tickets and actions
packed in ``google.protobuf.Any``) in :class:`~thalweg.flight.sql.service.FlightSql`.
Descriptors are paths ``["topics", <topic>]`` or commands whose bytes are a JSON read
ticket (the same object ``do_get`` takes), so a client can ask for endpoints of a specific
read. Every endpoint covers one partition, so readers can fetch in parallel.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow.flight as fl

from thalweg.config.models import (
    BrokerSourceConfig,
    FlightAuthConfig,
    FlightServingConfig,
    FlightTlsConfig,
)
from thalweg.errors import InvariantError, TicketError
from thalweg.flight.auth import MIDDLEWARE_KEY, HandshakeOnly, TokenAuthFactory
from thalweg.flight.errors import UnimplementedError, install, refusals
from thalweg.flight.limits import StreamLimiter
from thalweg.flight.put.service import Puts
from thalweg.flight.read.nodes import NodeReads, NodeTicket
from thalweg.flight.read.service import Reads
from thalweg.flight.read.tickets import ReadTicket, read_ticket, ticket_body
from thalweg.flight.sql.engine import SqlEngine
from thalweg.flight.sql.messages import is_sql
from thalweg.flight.sql.service import ACTIONS as SQL_ACTIONS
from thalweg.flight.sql.service import FlightSql
from thalweg.flight.sql.tables import LaneTables
from thalweg.flight.tracing import TRACE_KEY, TracingMiddlewareFactory
from thalweg.group.owners import OwnerDirectory
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.ops.metrics import Metrics
from thalweg.ops.tracing import Tracing
from thalweg.recovery.views import NodeViews


class GatewayFlightServer(fl.FlightServerBase):  # type: ignore[misc]
    """Serves the lanes of one gateway over Arrow Flight.

    Args:
        location: where to listen, e.g. ``grpc://127.0.0.1:8815`` (port 0 picks one).
        catalog: the read-side view of the lanes.
        advertise: the location put into endpoints (defaults to the bound location).

    Every handler's errors go through :func:`thalweg.flight.errors.refusals`: the client
    reads a message and a status code, never a traceback (``docs/flight-api.md``).
    """

    def __init__(
        self,
        location: str,
        catalog: LaneCatalog,
        metrics: Metrics,
        advertise: str | None = None,
        *,
        sources: dict[str, BrokerSourceConfig] | None = None,
        pattern_sources: Sequence[BrokerSourceConfig] = (),
        health: Callable[[], dict[str, Any]] | None = None,
        auth: FlightAuthConfig | None = None,
        tls: FlightTlsConfig | None = None,
        serving: FlightServingConfig | None = None,
        idempotent_producer: bool = False,
        tracing: Tracing | None = None,
        put_timeout_ms: int = 30_000,
        nodes: NodeViews | None = None,
        owners: OwnerDirectory | None = None,
        **kwargs: Any,
    ) -> None:
        install()
        middleware: dict[str, Any] = {}
        if tracing is not None and tracing.enabled:
            middleware[TRACE_KEY] = TracingMiddlewareFactory(tracing)
        if auth is not None:
            middleware[MIDDLEWARE_KEY] = TokenAuthFactory(auth)
            if auth.users:
                kwargs["auth_handler"] = HandshakeOnly()
        if middleware:
            kwargs["middleware"] = middleware
        if tls is not None:
            cert, key, client_ca = tls.read()
            kwargs["tls_certificates"] = [fl.CertKeyPair(cert, key)]
            if client_ca is not None:  # mutual TLS: no call without a trusted client cert
                kwargs["verify_client"] = True
                kwargs["root_certificates"] = client_ca
        super().__init__(location, **kwargs)
        limits = serving or FlightServingConfig()
        streams = StreamLimiter(limits.max_streams_per_caller)
        self._metrics = metrics
        self._health = health or dict
        host = location.partition("://")[2].rsplit(":", 1)[0]
        self.url = advertise or f"{'grpc+tls' if tls else 'grpc'}://{host}:{self.port}"
        self.reads = Reads(catalog, metrics, limits, streams, self.url, owners)
        self.nodes = (
            NodeReads(nodes, self.url, metrics=metrics, streams=streams)
            if nodes is not None
            else None
        )
        self.puts = Puts(
            metrics,
            limits,
            streams,
            sources=sources or {},
            pattern_sources=pattern_sources,
            idempotent_producer=idempotent_producer,
            put_timeout_ms=put_timeout_ms,
        )
        self.sql = (
            FlightSql(
                SqlEngine(LaneTables(catalog, owners, nodes), limits.sql),
                self.puts,
                metrics,
                streams,
            )
            if limits.sql.enabled
            else None
        )

    def _called(self, verb: str) -> None:
        self._metrics.flight_calls.labels(verb).inc()

    def _sql(self, data: bytes) -> FlightSql | None:
        """The Flight SQL service when ``data`` is a Flight SQL command or ticket."""
        if not is_sql(data):
            return None
        if self.sql is None:
            raise UnimplementedError("Flight SQL is off on this gateway (gateway.flight.sql)")
        return self.sql

    def _read_of(self, descriptor: fl.FlightDescriptor) -> NodeTicket | ReadTicket:
        """What a descriptor asks to read — a pipeline node's rows, else a lane — with
        its command decoded once."""
        is_cmd = descriptor.descriptor_type == fl.DescriptorType.CMD
        body = ticket_body(descriptor.command) if is_cmd else None
        if self.nodes is not None:
            node = self.nodes.descriptor_ticket(descriptor, body)
            if node is not None:
                return node
        return self.reads.ticket_of(descriptor, body)

    @staticmethod
    def _command(descriptor: fl.FlightDescriptor) -> bytes:
        return descriptor.command if descriptor.descriptor_type == fl.DescriptorType.CMD else b""

    # -- reads ---------------------------------------------------------------------

    @refusals
    def list_flights(
        self, context: fl.ServerCallContext, criteria: bytes
    ) -> Iterator[fl.FlightInfo]:
        self._called("list_flights")
        yield from self.reads.list_flights(context, criteria)
        if self.nodes is not None and not criteria:
            yield from self.nodes.list_flights(context)

    @refusals
    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        self._called("get_flight_info")
        sql = self._sql(self._command(descriptor))
        if sql is not None:
            return sql.get_flight_info(context, descriptor)
        read = self._read_of(descriptor)
        if isinstance(read, NodeTicket) and self.nodes is not None:
            return self.nodes.get_flight_info(context, read)
        if not isinstance(read, ReadTicket):
            raise InvariantError("a node read without node reads")
        return self.reads.get_flight_info(context, descriptor, read)

    @refusals
    def get_schema(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.SchemaResult:
        self._called("get_schema")
        sql = self._sql(self._command(descriptor))
        if sql is not None:
            return sql.get_schema(context, descriptor)
        read = self._read_of(descriptor)
        if isinstance(read, NodeTicket) and self.nodes is not None:
            return self.nodes.get_schema(context, read)
        if not isinstance(read, ReadTicket):
            raise InvariantError("a node read without node reads")
        return self.reads.get_schema(context, read)

    @refusals
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        self._called("do_get")
        sql = self._sql(ticket.ticket)
        if sql is not None:
            return sql.do_get(context, ticket.ticket)
        body = ticket_body(ticket.ticket)  # the one parse of the ticket's bytes
        node = self.nodes.ticket_of(body) if self.nodes is not None else None
        if node is not None and self.nodes is not None:
            return self.nodes.do_get(context, node)
        return self.reads.do_get(context, read_ticket(body))

    # -- writes ----------------------------------------------------------------------

    @refusals
    def do_put(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> None:
        self._called("do_put")
        sql = self._sql(self._command(descriptor))
        if sql is not None:
            sql.do_put(context, descriptor, reader, writer)
            return
        self.puts.do_put(context, descriptor, reader, writer)

    @refusals
    def do_exchange(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.MetadataRecordBatchWriter,
    ) -> None:
        raise UnimplementedError("do_exchange is not served; read with do_get, write with do_put")

    # -- actions -------------------------------------------------------------------

    def list_actions(self, context: fl.ServerCallContext) -> list[tuple[str, str]]:
        return [
            (
                "describe-topic",
                "Partitions with earliest/durable/committed/latest positions. "
                'Body: {"topic": "<name>"}',
            ),
            ("health", "The gateway's health tree (as /health)."),
            *(SQL_ACTIONS.items() if self.sql is not None else ()),
        ]

    @refusals
    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[bytes]:
        self._called("do_action")
        if action.type == "health":
            yield json.dumps(self._health()).encode()
            return
        if action.type == "describe-topic":
            yield self.reads.describe(context, action.body.to_pybytes())
            return
        if self.sql is not None and is_sql(action.body.to_pybytes()):
            yield from self.sql.do_action(context, action)
            return
        raise TicketError(f"unknown action {action.type!r}; see list_actions")

    def shutdown(self) -> None:
        """End follow streams, then stop (gRPC waits for open calls to finish)."""
        self.reads.close()
        if self.nodes is not None:
            self.nodes.close()
        super().shutdown()
