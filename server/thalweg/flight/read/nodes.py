"""Pipeline nodes over Flight, read like topics (``docs/flight-api.md``, "Nodes").

Every node is listed as the path descriptor ``["nodes", <name>]`` and read with a JSON
ticket in any of three spellings: ``{"node": "<name>"}``; a topic ticket whose lane
names the node, ``{"topic": "orders", "lane": "node:<name>"}``; or a topic ticket whose
topic is the node's name (``gw.read("orders_clean")`` — node and topic names never
collide). Optional: ``"partitions": [..]`` and ``"end": "follow"`` (or
``"follow": true``), which streams history and then keeps following the node as its
input lane grows (each partition resumes at the position it reached: no gap, no
duplicate). The rows are the node's (``thalweg.recovery.views``): a materialised node's
own lane, any other node derived from the lanes at read time, with the ``_twg_``
locators of the records they came from.

A caller may read a node when it may read the topic the node derives from; otherwise
the node does not exist for it. Binary (protobuf) tickets do not name nodes.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq

from thalweg.errors import TicketError
from thalweg.flight.auth import caller_key, principal_of
from thalweg.flight.descriptors import text
from thalweg.flight.errors import refusing
from thalweg.flight.limits import StreamLimiter
from thalweg.flight.read.tickets import TicketBody
from thalweg.ops.metrics import Metrics
from thalweg.recovery.views import NodeInfo, NodeView, NodeViews

FOLLOW_POLL_S = 0.2  # how often a follow stream looks for new positions
_KEYS = {"node", "topic", "lane", "partitions", "start", "end", "follow", "metadata", "v"}


@dataclass(frozen=True, slots=True)
class NodeTicket:
    name: str
    partitions: list[int] | None
    follow: bool


def node_ticket(ticket: TicketBody, nodes: dict[str, NodeInfo]) -> NodeTicket | None:
    """The node read a decoded ticket asks for, or None when it is not a node read.

    Raises:
        TicketError: a node read with options a node does not take.
    """
    body = ticket.fields
    if not ticket.json or not isinstance(body, dict):
        return None
    lane = body.get("lane")
    if "node" in body:
        name = body["node"]
    elif isinstance(lane, str) and lane.startswith("node:"):
        name = lane[5:]
    elif isinstance(body.get("topic"), str) and body["topic"] in nodes:
        name = body["topic"]
    else:
        return None
    if not isinstance(name, str):
        raise TicketError('a node ticket is {"node": "<name>"}')
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise TicketError(f"a node read does not take {unknown}")
    if lane not in (None, "decoded") and lane != f"node:{name}":
        raise TicketError(f"a node read takes lane 'node:{name}', not {lane!r}")
    if body.get("start", "earliest") != "earliest":
        raise TicketError("a node read starts at the earliest position (start is not supported)")
    end = body.get("end", "now")
    if end not in ("now", "follow"):
        raise TicketError("a node read ends 'now' or 'follow'")
    parts = body.get("partitions")
    if parts is not None and (
        not isinstance(parts, list) or not all(isinstance(p, int) for p in parts)
    ):
        raise TicketError("partitions is a list of integers")
    return NodeTicket(name, parts, end == "follow" or body.get("follow") is True)


class NodeReads:
    """Serves the pipeline's nodes.

    Args:
        views: the configuration's nodes, each readable.
        url: the location put into endpoints.
    """

    def __init__(
        self,
        views: NodeViews,
        url: str,
        *,
        metrics: Metrics,
        streams: StreamLimiter,
    ) -> None:
        self._views = views
        self._url = url
        self._metrics = metrics
        self._streams = streams
        self._closing = False

    def close(self) -> None:
        """Ends follow streams (the server is shutting down)."""
        self._closing = True

    def ticket_of(self, ticket: TicketBody) -> NodeTicket | None:
        """The node read ``ticket`` asks for, or None (a lane read)."""
        return node_ticket(ticket, self._views.nodes())

    def descriptor_ticket(
        self, descriptor: fl.FlightDescriptor, body: TicketBody | None
    ) -> NodeTicket | None:
        """The node read a descriptor names (``["nodes", <node>]``, or a node ticket as
        its command, decoded once as ``body``), or None (a lane read)."""
        if descriptor.descriptor_type == fl.DescriptorType.PATH:
            path = [text(p) for p in descriptor.path]
            if not path or path[0] != "nodes":
                return None
            if len(path) != 2 or not path[1]:
                raise TicketError(f"unknown descriptor path {path!r}; use ['nodes', <node>]")
            return NodeTicket(str(path[1]), None, False)
        return None if body is None else self.ticket_of(body)

    def list_flights(self, context: fl.ServerCallContext) -> Iterator[fl.FlightInfo]:
        caller = principal_of(context)
        for name, info in sorted(self._views.nodes().items()):
            if caller.may("read", info.topic):
                yield self._info(NodeTicket(name, None, False))

    def get_flight_info(self, context: fl.ServerCallContext, read: NodeTicket) -> fl.FlightInfo:
        return self._info(self._readable(context, read))

    def get_schema(self, context: fl.ServerCallContext, read: NodeTicket) -> fl.SchemaResult:
        read = self._readable(context, read)
        return fl.SchemaResult(self._views.open(read.name).schema() or pa.schema([]))

    def do_get(self, context: fl.ServerCallContext, read: NodeTicket) -> fl.FlightDataStream:
        read = self._readable(context, read)
        view = self._views.open(read.name)

        def parts() -> list[int]:
            return [p for p in view.partitions() if read.partitions is None or p in read.partitions]

        def stopped() -> bool:
            return self._closing or bool(context.is_cancelled())

        rows = node_rows(view, parts, read.follow, stopped)
        schema = view.schema()
        first: pa.Table | None = None
        if schema is None:  # a sidecar's output is known from its answers only
            first = next(rows, None)
            if first is None:
                raise TicketError(
                    f"node {read.name!r} has no rows yet, so its schema is not known "
                    "(a sidecar's output); read it again once records arrived"
                )
            schema = first.schema
        active = self._metrics.flight_active_streams
        slot = self._streams.acquire(caller_key(context), on_release=active.dec)
        active.inc()

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                tables = rows if first is None else _chain_first(first, rows)
                for table in tables:
                    for batch in shaped(table, schema).to_batches(max_chunksize=64 * 1024):
                        self._metrics.flight_rows.labels("do_get").inc(batch.num_rows)
                        self._metrics.flight_bytes.labels("do_get").inc(batch.nbytes)
                        yield batch
            finally:
                slot.release()

        gen = batches()
        weakref.finalize(gen, slot.release)  # a stream cancelled before its first batch
        return fl.GeneratorStream(schema, refusing(gen, "do_get"))

    def _readable(self, context: fl.ServerCallContext, read: NodeTicket) -> NodeTicket:
        info = self._views.nodes().get(read.name)
        if info is None or not principal_of(context).may("read", info.topic):
            raise TicketError(f"unknown node {read.name!r}")
        return read

    def _info(self, read: NodeTicket) -> fl.FlightInfo:
        info = self._views.nodes()[read.name]
        view = self._views.open(read.name)
        schema = view.schema() or pa.schema([])
        rows = -1
        if info.materialised:
            rows = sum(
                pq.read_metadata(path).num_rows
                for p in view.partitions()
                if read.partitions is None or p in read.partitions
                for *_, path in view.layout.node_files(read.name, info.topic, p)
            )
        body: dict[str, object] = {"node": read.name}
        if read.partitions is not None:
            body["partitions"] = read.partitions
        if read.follow:
            body["end"] = "follow"
        endpoint = fl.FlightEndpoint(json.dumps(body).encode(), [self._url])
        descriptor = fl.FlightDescriptor.for_path("nodes", read.name)
        return fl.FlightInfo(schema, descriptor, [endpoint], rows, -1)


def node_rows(
    view: NodeView,
    partitions: Callable[[], list[int]],
    follow: bool,
    stopped: Callable[[], bool],
) -> Iterator[pa.Table]:
    """History partition by partition in position order; with ``follow``, then every
    position that becomes readable, each once (a partition resumes where it stopped; a
    partition that appears is read from its start)."""
    reached: dict[int, int] = {}
    while True:
        for p in partitions():
            epoch, ranges = view.ranges(p)
            for low, b in ranges:
                a = max(low, reached.get(p, 0))
                if a >= b:
                    continue
                yield from view.rows(p, epoch, a, b, stopped)
                if stopped():
                    return
                reached[p] = b
        if not follow:
            return
        deadline = time.monotonic() + FOLLOW_POLL_S
        while time.monotonic() < deadline:
            if stopped():
                return
            time.sleep(0.05)


def _chain_first(first: pa.Table, rest: Iterator[pa.Table]) -> Iterator[pa.Table]:
    yield first
    yield from rest


def shaped(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with every column of ``schema`` (missing ones null), in its order."""
    columns = [
        table.column(f.name).cast(f.type)
        if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)
