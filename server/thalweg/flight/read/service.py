"""The bodies of the read verbs, apart from the server that dispatches to them.

Every read goes through one check (may the caller read this topic? if not, the topic is
"unknown": a refusal never tells a caller that a topic it may not read exists) and one
choice of catalog (the current lane, or the closed epoch the ticket names).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as fl

from thalweg.config.models import FlightServingConfig
from thalweg.errors import TicketError
from thalweg.flight.auth import caller_key, principal_of
from thalweg.flight.descriptors import path_topic
from thalweg.flight.errors import refusing
from thalweg.flight.limits import StreamLimiter
from thalweg.flight.read.endpoints import plan_endpoints
from thalweg.flight.read.plan import plan_read
from thalweg.flight.read.stream import FollowLagError, read_stream
from thalweg.flight.read.tickets import MAX_TICKET_BYTES, OffsetPosition, ReadTicket, parse_ticket
from thalweg.lane.catalog import LaneCatalog
from thalweg.ops.metrics import Metrics


class Reads:
    """Serves the lanes of one catalog to readers.

    Args:
        catalog: the read-side view of the lanes.
        metrics: where rows and bytes sent are counted.
        limits: slice size and follow lag of the ``gateway.flight`` settings.
        streams: the per-caller stream limiter (shared with puts).
        url: the location put into endpoints.
    """

    def __init__(
        self,
        catalog: LaneCatalog,
        metrics: Metrics,
        limits: FlightServingConfig,
        streams: StreamLimiter,
        url: str,
    ) -> None:
        self._catalog = catalog
        self._metrics = metrics
        self._limits = limits
        self._streams = streams
        self._url = url
        self._closing = False

    def close(self) -> None:
        """End follow streams at their next step (the server is shutting down)."""
        self._closing = True

    # -- discovery -----------------------------------------------------------------

    def list_flights(
        self, context: fl.ServerCallContext, criteria: bytes
    ) -> Iterator[fl.FlightInfo]:
        prefix = criteria.decode("utf-8", "replace") if criteria else ""
        caller = principal_of(context)
        for topic in self._catalog.topics():
            if topic.startswith(prefix) and caller.may("read", topic):
                descriptor = fl.FlightDescriptor.for_path("topics", topic)
                try:
                    yield self._info(descriptor, ReadTicket(topic=topic))
                except TicketError:
                    yield self._info(descriptor, ReadTicket(topic=topic, lane="raw"))

    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        return self._info(descriptor, self._readable(context, self._ticket_of(descriptor)))

    def get_schema(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.SchemaResult:
        ticket = self._readable(context, self._ticket_of(descriptor))
        return fl.SchemaResult(plan_read(self._catalog_for(ticket), ticket).schema)

    def describe(self, context: fl.ServerCallContext, raw: bytes) -> bytes:
        """The ``describe-topic`` action: a topic's partitions and positions, as JSON."""
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
        return json.dumps(self._catalog.describe(topic)).encode()

    # -- do_get --------------------------------------------------------------------

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
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
            return ReadTicket(topic=path_topic(descriptor))
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
                    part.ticket.to_bytes(), [self._url], app_metadata=json.dumps(meta).encode()
                )
            )
        rows = [p.rows for p in parts]
        nbytes = [p.bytes for p in parts]
        total_rows = sum(r for r in rows if r is not None) if None not in rows else -1
        total_bytes = sum(b for b in nbytes if b is not None) if None not in nbytes else -1
        return fl.FlightInfo(plan.schema, descriptor, endpoints, total_rows, total_bytes)


def _offset(position: object) -> int | None:
    return position.offset if isinstance(position, OffsetPosition) else None
