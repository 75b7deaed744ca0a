"""The bodies of the read verbs, apart from the server that dispatches to them.

Every read goes through one check (may the caller read this topic? if not, the topic is
"unknown": a refusal never tells a caller that a topic it may not read exists) and one
choice of catalog (the current lane, or the closed epoch the ticket names).
"""

from __future__ import annotations

import json
import sys
import weakref
from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
import pyarrow.flight as fl

from thalweg.config.models import FlightServingConfig
from thalweg.errors import PartitionElsewhereError, TicketError
from thalweg.flight.auth import caller_key, principal_of
from thalweg.flight.descriptors import path_topic
from thalweg.flight.errors import refusing, relocation
from thalweg.flight.limits import StreamLimiter
from thalweg.flight.read.endpoints import EndpointPlan, plan_endpoints
from thalweg.flight.read.latest import fold_input, fold_latest
from thalweg.flight.read.plan import ReadPlan, answered_schema, plan_read
from thalweg.flight.read.stream import FollowLagError, HistoryGapError, read_stream
from thalweg.flight.read.tickets import (
    MAX_TICKET_BYTES,
    OffsetPosition,
    ReadTicket,
    TicketBody,
    read_ticket,
)
from thalweg.group.owners import OwnerDirectory
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.lane.read.shape import fit_stream_schema
from thalweg.ops.metrics import Metrics
from thalweg.records.columns import MetadataColumns


class Reads:
    """Serves the lanes of one catalog to readers.

    Args:
        catalog: the read-side view of the lanes.
        metrics: where rows and bytes sent are counted.
        limits: slice size and follow lag of the ``gateway.flight`` settings.
        streams: the per-caller stream limiter (shared with puts).
        url: the location put into endpoints.
        owners: the consumer group's partition owners; a read of a partition another
            gateway owns is sent there (its endpoint's location) or refused here with
            where to go — never answered partially (docs/lanes.md, "Many gateways").
    """

    def __init__(
        self,
        catalog: LaneCatalog,
        metrics: Metrics,
        limits: FlightServingConfig,
        streams: StreamLimiter,
        url: str,
        owners: OwnerDirectory | None = None,
    ) -> None:
        self._catalog = catalog
        self._owners = owners
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
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor, read: ReadTicket
    ) -> fl.FlightInfo:
        return self._info(descriptor, self._readable(context, read))

    def get_schema(self, context: fl.ServerCallContext, read: ReadTicket) -> fl.SchemaResult:
        ticket = self._readable(context, read)
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

    def do_get(self, context: fl.ServerCallContext, read: ReadTicket) -> fl.FlightDataStream:
        read = self._readable(context, read)
        catalog = self._catalog_for(read)
        latest = read.view == "latest"
        # The view answers with the asked columns and reads the fold's besides: one plan
        # (positions fixed once), of the read it folds.
        schema = answered_schema(catalog, read) if latest else None
        asked = (
            read
            if schema is None
            else fold_input(read, schema, catalog.columns, catalog.payload_schema(read.topic))
        )
        plan = plan_read(catalog, asked, lambda p: self._elsewhere(read, p) is not None)
        self._refuse_elsewhere(plan)
        schema = plan.schema if schema is None else schema
        streams = self._metrics.flight_active_streams
        slot = self._streams.acquire(caller_key(context), on_release=streams.dec)
        streams.inc()

        def stopped() -> bool:
            return self._closing or bool(context.is_cancelled())

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                stream = read_stream(
                    catalog,
                    plan,
                    stopped,
                    max_lag=self._limits.follow_max_lag_records,
                    moved=lambda p: self._elsewhere(read, p),
                )
                if latest:
                    stream = _folded(stream, catalog.columns, schema)
                for batch in stream:
                    self._metrics.flight_rows.labels("do_get").inc(batch.num_rows)
                    self._metrics.flight_bytes.labels("do_get").inc(batch.nbytes)
                    yield batch
            except (FollowLagError, HistoryGapError) as exc:
                raise fl.FlightUnavailableError(str(exc)) from exc
            except PartitionElsewhereError as exc:
                raise relocation(exc) from exc
            finally:
                slot.release()

        gen = batches()
        weakref.finalize(gen, slot.release)  # a stream cancelled before its first batch
        return fl.GeneratorStream(schema, refusing(gen, "do_get"))

    # -- owners --------------------------------------------------------------------

    def _elsewhere(self, ticket: ReadTicket, partition: int | None) -> str | None:
        """The owner a read of ``partition`` must go to, or None to serve it here.

        Another member's partition is served here only from a shared ``data_dir``, and
        then only its history: its live tail is at the owner. Closed epochs are history
        of this ``data_dir``, always served here.
        """
        if self._owners is None or partition is None or ticket.epoch is not None:
            return None
        other = self._owners.owned_elsewhere(ticket.topic, partition)
        if other is None or (self._owners.shared_lane and ticket.end != "follow"):
            return None
        return other

    def _refuse_elsewhere(self, plan: ReadPlan) -> None:
        """A do_get that includes a partition owned elsewhere is refused before it sends
        anything, with where each partition should be read from (UNAVAILABLE)."""
        for r in plan.ranges:
            owner = self._elsewhere(plan.ticket, r.partition)
            if owner is not None:
                # No positions: nothing was sent, and this gateway's view of the other
                # partitions' positions is not the owner's; the ticket stands as asked.
                raise relocation(
                    PartitionElsewhereError(
                        f"{plan.ticket.topic}[{r.partition}] is served by the gateway that "
                        f"owns it, {owner} (ask get_flight_info: each endpoint names its "
                        "partition's owner)",
                        topic=plan.ticket.topic,
                        owner=owner,
                        positions={},
                    )
                )

    # -- helpers -------------------------------------------------------------------

    def _readable(self, context: fl.ServerCallContext, ticket: ReadTicket) -> ReadTicket:
        """The ticket, if the caller may read its topic; else "unknown topic" (no leak)."""
        if not principal_of(context).may("read", ticket.topic):
            raise TicketError(f"unknown topic {ticket.topic!r}")
        return ticket

    def _catalog_for(self, ticket: ReadTicket) -> LaneCatalog:
        """The current lane, or the closed epoch the ticket names."""
        return self._catalog if ticket.epoch is None else self._catalog.for_epoch(ticket.epoch)

    @staticmethod
    def ticket_of(descriptor: fl.FlightDescriptor, body: TicketBody | None) -> ReadTicket:
        """The lane read a descriptor names: a path's topic, or its command's ticket
        (``body``, decoded once by the server)."""
        if descriptor.descriptor_type == fl.DescriptorType.PATH or body is None:
            return ReadTicket(topic=path_topic(descriptor))
        return read_ticket(body)

    def _info(self, descriptor: fl.FlightDescriptor, ticket: ReadTicket) -> fl.FlightInfo:
        """Endpoints of the read; each carries ``{"partition", "start", "end", "rows",
        "bytes", "location"}`` as app metadata, and the totals are set when every part is
        known. A partition another gateway serves is one endpoint at its owner, with the
        ticket as asked (the owner resolves its positions)."""
        catalog = self._catalog_for(ticket)
        plan = plan_read(catalog, ticket, lambda p: self._elsewhere(ticket, p) is not None)
        away = {r.partition: self._elsewhere(ticket, r.partition) for r in plan.ranges}
        here = replace(plan, ranges=tuple(r for r in plan.ranges if away[r.partition] is None))
        # A latest view folds a partition whole: one endpoint per partition.
        slice_rows = sys.maxsize if ticket.view == "latest" else self._limits.slice_rows
        parts = [(p, self._url) for p in plan_endpoints(catalog, here, slice_rows)]
        for r in plan.ranges:
            owner = away[r.partition]
            if owner is not None:
                moved = ticket.model_copy(update={"partitions": [r.partition]})
                parts.append((EndpointPlan(moved, None, None), owner))
        parts.sort(key=lambda x: x[0].ticket.partitions[0] if x[0].ticket.partitions else -1)
        endpoints = []
        for part, where in parts:
            meta = {
                "partition": part.ticket.partitions[0] if part.ticket.partitions else None,
                "start": _offset(part.ticket.start),
                "end": _offset(part.ticket.end),
                "rows": part.rows,
                "bytes": part.bytes,
                "location": where,
            }
            endpoints.append(
                fl.FlightEndpoint(
                    part.ticket.to_bytes(), [where], app_metadata=json.dumps(meta).encode()
                )
            )
        rows = [p.rows for p, _ in parts]
        nbytes = [p.bytes for p, _ in parts]
        total_rows = sum(r for r in rows if r is not None) if None not in rows else -1
        total_bytes = sum(b for b in nbytes if b is not None) if None not in nbytes else -1
        return fl.FlightInfo(plan.schema, descriptor, endpoints, total_rows, total_bytes)


def _folded(
    stream: Iterator[pa.RecordBatch], columns: MetadataColumns, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The latest view of ``stream``: folded (``flight/read/latest.py``), then given the
    ticket's schema (its metadata policy and columns)."""
    table = fold_latest(stream, columns, values=columns.value in schema.names)
    if table is not None:
        yield from fit_stream_schema(table, schema).to_batches(max_chunksize=65_536)


def _offset(position: object) -> int | None:
    return position.offset if isinstance(position, OffsetPosition) else None
