"""The gateway's Flight server: list_flights, get_flight_info, get_schema, do_get.

Descriptors are paths ``["topics", <topic>]`` or commands whose bytes are a JSON read
ticket (the same object ``do_get`` takes), so a client can ask for endpoints of a
specific read. Every endpoint covers one partition, so readers can fetch in parallel.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from thalweg.config.models import (
    FlightAuthConfig,
    FlightServingConfig,
    FlightTlsConfig,
    PulsarSourceConfig,
    SourceConfig,
)
from thalweg.errors import ThalwegError, TicketError
from thalweg.flight.auth import (
    MIDDLEWARE_KEY,
    HandshakeOnly,
    TokenAuthFactory,
    caller_key,
    principal_of,
)
from thalweg.flight.endpoints import plan_endpoints
from thalweg.flight.errors import (
    InvalidArgumentError,
    UnimplementedError,
    install,
    refusals,
    refusing,
)
from thalweg.flight.limits import StreamLimiter
from thalweg.flight.plan import plan_read
from thalweg.flight.producers import KafkaTopicProducer, PulsarTopicProducer, TopicProducer
from thalweg.flight.put import PutPlan, plan_put, refuse_unsafe_types
from thalweg.flight.stream import FollowLagError, read_stream
from thalweg.flight.tickets import MAX_TICKET_BYTES, OffsetPosition, ReadTicket, parse_ticket
from thalweg.flight.tracing import TRACE_KEY, TracingMiddlewareFactory, call_span_context
from thalweg.lane.catalog import LaneCatalog
from thalweg.ops.metrics import Metrics
from thalweg.ops.tracing import Tracing, traceparent_of
from thalweg.registry.confluent import ConfluentRegistry
from thalweg.registry.encoding import avro_encoder_for_topic, protobuf_encoder_for_topic
from thalweg.registry.factory import open_registry
from thalweg.sinks.kafka import KafkaWriter
from thalweg.sources.kafka_security import security_kwargs

log = logging.getLogger(__name__)


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
        sources: dict[str, SourceConfig] | None = None,
        pattern_sources: Sequence[PulsarSourceConfig] = (),
        health: Callable[[], dict[str, Any]] | None = None,
        auth: FlightAuthConfig | None = None,
        tls: FlightTlsConfig | None = None,
        serving: FlightServingConfig | None = None,
        idempotent_producer: bool = False,
        tracing: Tracing | None = None,
        put_timeout_ms: int = 30_000,
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
        self._limits = serving or FlightServingConfig()
        self._streams = StreamLimiter(self._limits.max_streams_per_caller)
        self._idempotent = idempotent_producer
        self._put_timeout_ms = put_timeout_ms
        self._catalog = catalog
        self._metrics = metrics
        self._sources = sources or {}
        self._patterns = [
            (re.compile(s.topics_pattern), s) for s in pattern_sources if s.topics_pattern
        ]
        self._health = health or dict
        self._closing = False
        host = location.partition("://")[2].rsplit(":", 1)[0]
        self.url = advertise or f"{'grpc+tls' if tls else 'grpc'}://{host}:{self.port}"

    # -- discovery -----------------------------------------------------------------

    @refusals
    def list_flights(
        self, context: fl.ServerCallContext, criteria: bytes
    ) -> Iterator[fl.FlightInfo]:
        self._metrics.flight_calls.labels("list_flights").inc()
        prefix = criteria.decode("utf-8", "replace") if criteria else ""
        caller = principal_of(context)
        for topic in self._catalog.topics():
            if topic.startswith(prefix) and caller.may("read", topic):
                ticket = ReadTicket(topic=topic)
                try:
                    yield self._info(fl.FlightDescriptor.for_path("topics", topic), ticket)
                except TicketError:
                    yield self._info(
                        fl.FlightDescriptor.for_path("topics", topic),
                        ReadTicket(topic=topic, lane="raw"),
                    )

    @refusals
    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        self._metrics.flight_calls.labels("get_flight_info").inc()
        return self._info(descriptor, self._readable(context, self._ticket_of(descriptor)))

    @refusals
    def get_schema(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.SchemaResult:
        self._metrics.flight_calls.labels("get_schema").inc()
        ticket = self._readable(context, self._ticket_of(descriptor))
        return fl.SchemaResult(plan_read(self._catalog_for(ticket), ticket).schema)

    # -- reads ---------------------------------------------------------------------

    @refusals
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        self._metrics.flight_calls.labels("do_get").inc()
        read = self._readable(context, parse_ticket(ticket.ticket))
        catalog = self._catalog_for(read)
        plan = plan_read(catalog, read)
        streams = self._metrics.flight_active_streams
        slot = self._streams.acquire(caller_key(context), on_release=streams.dec)
        streams.inc()

        def stopped() -> bool:
            return self._closing or bool(context.is_cancelled())

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                for batch in read_stream(
                    catalog, plan, stopped, max_lag=self._limits.follow_max_lag_records
                ):
                    self._metrics.flight_rows.labels("do_get").inc(batch.num_rows)
                    self._metrics.flight_bytes.labels("do_get").inc(batch.nbytes)
                    yield batch
            except FollowLagError as exc:
                raise fl.FlightUnavailableError(str(exc)) from exc
            finally:
                slot.release()

        gen = batches()
        weakref.finalize(gen, slot.release)  # a stream cancelled before its first batch
        return fl.GeneratorStream(plan.schema, refusing(gen, "do_get"))

    # -- writes ------------------------------------------------------------------

    @refusals
    def do_put(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> None:
        """Produce the rows of ``["topics", <topic>]`` and acknowledge each batch with
        ``{"rows": n, "partitions": {"<p>": [first, last]}}`` as PutResult metadata."""
        self._metrics.flight_calls.labels("do_put").inc()
        topic = self._put_topic(descriptor)
        if not principal_of(context).may("write", topic):
            raise fl.FlightUnauthorizedError(f"not allowed to write to {topic!r}")
        try:
            refuse_unsafe_types(reader.schema)
            source = self._source_for(topic)
            plan = plan_put(
                topic,
                reader.schema,
                source,
                self._avro_encoder(topic, source),
                self._protobuf_encoder(topic, source),
            )
        except ThalwegError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        assert source is not None
        slot = self._streams.acquire(caller_key(context))
        span_ctx = call_span_context(context)
        traceparent = traceparent_of(span_ctx) if span_ctx is not None else None
        try:
            written = asyncio.run(self._produce(plan, source, reader, writer, traceparent))
        finally:
            slot.release()
        self._metrics.flight_rows.labels("do_put").inc(written)

    async def _produce(
        self,
        plan: PutPlan,
        source: SourceConfig,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
        traceparent: bytes | None = None,
    ) -> int:
        """Validate, encode and produce batch by batch; every refusal says how many rows
        were already produced (and acknowledged), so the caller knows exactly what landed."""
        total = 0
        received = 0
        limits = self._limits
        out = self._producer_for(source)
        try:
            await out.start()
        except ThalwegError as exc:
            hint = (
                " (gateway.idempotent_producer is on: the broker must support idempotent producers)"
                if self._idempotent
                else ""
            )
            raise fl.FlightServerError(
                f"cannot start a producer for {plan.topic!r}: {exc}{hint}; 0 rows were produced"
            ) from exc
        try:
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                except (pa.ArrowException, OSError) as exc:  # ArrowIOError is an OSError
                    raise InvalidArgumentError(
                        f"unreadable Arrow stream ({exc}); {total} rows were produced"
                    ) from exc
                batch = chunk.data
                if batch is None:  # metadata-only message
                    continue
                size = batch.get_total_buffer_size()
                received += size
                try:
                    if size > limits.max_batch_bytes:
                        raise TicketError(
                            f"a batch of {size} bytes exceeds gateway.flight.max_batch_bytes "
                            f"({limits.max_batch_bytes}); send smaller batches"
                        )
                    if received > limits.max_put_bytes:
                        raise TicketError(
                            f"this put exceeds gateway.flight.max_put_bytes "
                            f"({limits.max_put_bytes}); split it into several puts"
                        )
                    batch.validate(full=True)
                    rows = plan.rows(batch)
                    if traceparent is not None:
                        rows = rows.with_header(b"traceparent", traceparent)
                except (pa.ArrowException, TicketError) as exc:
                    raise InvalidArgumentError(
                        f"invalid batch after row {total} ({exc}); {total} rows were produced"
                    ) from exc
                try:
                    ack = await out.send(plan.topic, rows)
                except ThalwegError as exc:
                    raise fl.FlightServerError(
                        f"producing to {plan.topic!r} failed after {total} rows: {exc}"
                    ) from exc
                total += int(ack["rows"])
                self._metrics.flight_bytes.labels("do_put").inc(size)
                writer.write(pa.py_buffer(json.dumps(ack).encode()))
        finally:
            await out.stop()
        return total

    def _producer_for(self, source: SourceConfig) -> TopicProducer:
        if isinstance(source, PulsarSourceConfig):
            return PulsarTopicProducer(source, self._put_timeout_ms)
        return KafkaTopicProducer(
            KafkaWriter(
                source.bootstrap_servers,
                max_request_size=16 << 20,
                idempotent=self._idempotent,
                request_timeout_ms=self._put_timeout_ms,
                **security_kwargs(source),
            )
        )

    def _source_for(self, topic: str) -> SourceConfig | None:
        """The source a put to ``topic`` produces through: the one that lists it, else a
        Pulsar source whose ``topics_pattern`` matches the whole topic name."""
        found = self._sources.get(topic)
        if found is None:
            for pattern, source in self._patterns:
                if pattern.fullmatch(topic):
                    return source
        return found

    def _put_topic(self, descriptor: fl.FlightDescriptor) -> str:
        if descriptor.descriptor_type != fl.DescriptorType.PATH:
            raise TicketError("do_put takes a path descriptor ['topics', <topic>]")
        path = [_text(p) for p in descriptor.path]
        if len(path) != 2 or path[0] != "topics" or not path[1]:
            raise TicketError(f"unknown descriptor path {path!r}; use ['topics', <topic>]")
        return str(path[1])

    def _avro_encoder(
        self, topic: str, source: SourceConfig | None
    ) -> Callable[[pa.Schema], Callable[[pa.Table], list[bytes]]] | None:
        if source is None or source.registry is None or source.registry.url is None:
            return None
        registry = open_registry(source.registry)
        assert isinstance(registry, ConfluentRegistry)

        def make(schema: pa.Schema) -> Callable[[pa.Table], list[bytes]]:
            return avro_encoder_for_topic(registry, topic, schema).encode

        return make

    def _protobuf_encoder(
        self, topic: str, source: SourceConfig | None
    ) -> Callable[[], tuple[Any, pa.Schema]] | None:
        if source is None or source.format != "protobuf":
            return None
        descriptor_path = source.protobuf_descriptor_set

        def make() -> tuple[Any, pa.Schema]:
            if descriptor_path is not None:
                return protobuf_encoder_for_topic(
                    topic, descriptor_set=descriptor_path.read_bytes()
                )
            if source.registry is None or source.registry.url is None:
                raise TicketError(f"topic {topic!r}: Protobuf puts need a registry url")
            registry = open_registry(source.registry)
            assert isinstance(registry, ConfluentRegistry)
            return protobuf_encoder_for_topic(topic, registry=registry)

        return make

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
        ]

    @refusals
    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> Iterator[bytes]:
        self._metrics.flight_calls.labels("do_action").inc()
        if action.type == "health":
            yield json.dumps(self._health()).encode()
            return
        if action.type == "describe-topic":
            raw = action.body.to_pybytes()
            try:
                if len(raw) > MAX_TICKET_BYTES:
                    raise ValueError("too large")
                body = json.loads(raw or b"{}")
                topic = body["topic"]
                if not isinstance(topic, str):
                    raise TypeError("topic is not a string")
            except (ValueError, KeyError, TypeError, RecursionError) as exc:
                raise TicketError('describe-topic takes {"topic": "<name>"}') from exc
            if topic not in self._catalog.topics() or not principal_of(context).may("read", topic):
                raise TicketError(f"unknown topic {topic!r}")
            yield json.dumps(self._catalog.describe(topic)).encode()
            return
        raise TicketError(f"unknown action {action.type!r}; see list_actions")

    def shutdown(self) -> None:
        """End follow streams, then stop (gRPC waits for open calls to finish)."""
        self._closing = True
        super().shutdown()

    # -- helpers -------------------------------------------------------------------

    def _readable(self, context: fl.ServerCallContext, ticket: ReadTicket) -> ReadTicket:
        """The ticket, if the caller may read its topic; else "unknown topic" (no leak)."""
        if not principal_of(context).may("read", ticket.topic):
            raise TicketError(f"unknown topic {ticket.topic!r}")
        return ticket

    def _catalog_for(self, ticket: ReadTicket) -> LaneCatalog:
        """The current lane, or the closed epoch the ticket names."""
        return self._catalog if ticket.epoch is None else self._catalog.for_epoch(ticket.epoch)

    def _ticket_of(self, descriptor: fl.FlightDescriptor) -> ReadTicket:
        if descriptor.descriptor_type == fl.DescriptorType.PATH:
            path = [_text(p) for p in descriptor.path]
            if len(path) != 2 or path[0] != "topics" or not path[1]:
                raise TicketError(f"unknown descriptor path {path!r}; use ['topics', <topic>]")
            return ReadTicket(topic=path[1])
        return parse_ticket(descriptor.command)

    def _info(self, descriptor: fl.FlightDescriptor, ticket: ReadTicket) -> fl.FlightInfo:
        """Endpoints of the read; each carries ``{"partition", "start", "end", "rows",
        "bytes"}`` as app metadata, and the totals are set when every part is known."""
        catalog = self._catalog_for(ticket)
        plan = plan_read(catalog, ticket)
        parts = plan_endpoints(catalog, plan, self._limits.slice_rows)
        endpoints = []
        for part in parts:
            meta = {
                "partition": part.ticket.partitions[0] if part.ticket.partitions else None,
                "start": _offset(part.ticket.start),
                "end": _offset(part.ticket.end),
                "rows": part.rows,
                "bytes": part.bytes,
            }
            endpoints.append(
                fl.FlightEndpoint(
                    part.ticket.to_bytes(), [self.url], app_metadata=json.dumps(meta).encode()
                )
            )
        rows = [p.rows for p in parts]
        nbytes = [p.bytes for p in parts]
        total_rows = sum(r for r in rows if r is not None) if None not in rows else -1
        total_bytes = sum(b for b in nbytes if b is not None) if None not in nbytes else -1
        return fl.FlightInfo(plan.schema, descriptor, endpoints, total_rows, total_bytes)


def _text(part: bytes | str) -> str:
    return part.decode(errors="replace") if isinstance(part, bytes) else part


def _offset(position: object) -> int | None:
    return position.offset if isinstance(position, OffsetPosition) else None
