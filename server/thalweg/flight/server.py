"""The gateway's Flight server: list_flights, get_flight_info, get_schema, do_get.

Descriptors are paths ``["topics", <topic>]`` or commands whose bytes are a JSON read
ticket (the same object ``do_get`` takes), so a client can ask for endpoints of a
specific read. Every endpoint covers one partition, so readers can fetch in parallel.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from thalweg.errors import TicketError
from thalweg.flight.plan import output_schema, plan_read
from thalweg.flight.stream import read_stream
from thalweg.flight.tickets import ReadTicket, parse_ticket
from thalweg.lane.catalog import LaneCatalog
from thalweg.ops.metrics import Metrics

log = logging.getLogger(__name__)


def _invalid(exc: TicketError) -> pa.ArrowInvalid:
    # pyarrow.flight maps ArrowInvalid to gRPC INVALID_ARGUMENT.
    return pa.ArrowInvalid(str(exc))


class GatewayFlightServer(fl.FlightServerBase):  # type: ignore[misc]
    """Serves the lanes of one gateway over Arrow Flight.

    Args:
        location: where to listen, e.g. ``grpc://127.0.0.1:8815`` (port 0 picks one).
        catalog: the read-side view of the lanes.
        advertise: the location put into endpoints (defaults to the bound location).
    """

    def __init__(
        self,
        location: str,
        catalog: LaneCatalog,
        metrics: Metrics,
        advertise: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(location, **kwargs)
        self._catalog = catalog
        self._metrics = metrics
        self._closing = False
        host = location.split("://", 1)[1].rsplit(":", 1)[0]
        self.url = advertise or f"grpc://{host}:{self.port}"

    # -- discovery -----------------------------------------------------------------

    def list_flights(
        self, context: fl.ServerCallContext, criteria: bytes
    ) -> Iterator[fl.FlightInfo]:
        self._metrics.flight_calls.labels("list_flights").inc()
        prefix = criteria.decode("utf-8", "replace") if criteria else ""
        for topic in self._catalog.topics():
            if topic.startswith(prefix):
                ticket = ReadTicket(topic=topic)
                try:
                    yield self._info(fl.FlightDescriptor.for_path("topics", topic), ticket)
                except TicketError:
                    yield self._info(
                        fl.FlightDescriptor.for_path("topics", topic),
                        ReadTicket(topic=topic, lane="raw"),
                    )

    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        self._metrics.flight_calls.labels("get_flight_info").inc()
        try:
            return self._info(descriptor, self._ticket_of(descriptor))
        except TicketError as exc:
            raise _invalid(exc) from exc

    def get_schema(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.SchemaResult:
        self._metrics.flight_calls.labels("get_schema").inc()
        try:
            ticket = self._ticket_of(descriptor)
            if ticket.topic not in self._catalog.topics():
                raise TicketError(f"unknown topic {ticket.topic!r}")
            schema, _ = output_schema(self._catalog, ticket)
        except TicketError as exc:
            raise _invalid(exc) from exc
        return fl.SchemaResult(schema)

    # -- reads ---------------------------------------------------------------------

    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        self._metrics.flight_calls.labels("do_get").inc()
        try:
            plan = plan_read(self._catalog, parse_ticket(ticket.ticket))
        except TicketError as exc:
            raise _invalid(exc) from exc
        streams = self._metrics.flight_active_streams

        def batches() -> Iterator[pa.RecordBatch]:
            streams.inc()
            try:

                def stopped() -> bool:
                    return self._closing or bool(context.is_cancelled())

                for batch in read_stream(self._catalog, plan, stopped):
                    self._metrics.flight_rows.labels("do_get").inc(batch.num_rows)
                    self._metrics.flight_bytes.labels("do_get").inc(batch.nbytes)
                    yield batch
            finally:
                streams.dec()

        return fl.GeneratorStream(plan.schema, batches())

    def shutdown(self) -> None:
        """End follow streams, then stop (gRPC waits for open calls to finish)."""
        self._closing = True
        super().shutdown()

    # -- helpers -------------------------------------------------------------------

    def _ticket_of(self, descriptor: fl.FlightDescriptor) -> ReadTicket:
        if descriptor.descriptor_type == fl.DescriptorType.PATH:
            path = [p.decode() if isinstance(p, bytes) else p for p in descriptor.path]
            if len(path) != 2 or path[0] != "topics":
                raise TicketError(f"unknown descriptor path {path!r}; use ['topics', <topic>]")
            return ReadTicket(topic=path[1])
        return parse_ticket(descriptor.command)

    def _info(self, descriptor: fl.FlightDescriptor, ticket: ReadTicket) -> fl.FlightInfo:
        plan = plan_read(self._catalog, ticket)
        endpoints = [
            fl.FlightEndpoint(
                ticket.model_copy(update={"partitions": [r.partition]}).to_bytes(), [self.url]
            )
            for r in plan.ranges
        ]
        # Exact counts come from segment footers; known only for whole-lane reads.
        total = -1
        if ticket.start == "earliest" and ticket.end == "now":
            total = sum(self._catalog.durable_rows(ticket.topic, r.partition) for r in plan.ranges)
        return fl.FlightInfo(plan.schema, descriptor, endpoints, total, -1)
