"""Materialised nodes over Flight: a node's own lane, read like a topic's history.

A node is named by the path descriptor ``["nodes", <name>]`` and read with the JSON
ticket ``{"node": "<name>"}`` (optionally ``"partitions": [..]``): every row of its lane
(``data_dir/nodes/<name>/``, docs/pipeline.md), partition by partition in position
order, with the ``_twg_`` locators of the records it derives from. A caller may read a
node when it may read the topic the node derives from; otherwise the node is unknown to
it. History only: a node has no live tail (``follow`` is refused), and binary tickets do
not name nodes yet.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq

from thalweg.errors import TicketError
from thalweg.flight.auth import caller_key, principal_of
from thalweg.flight.descriptors import text
from thalweg.flight.errors import refusing
from thalweg.flight.limits import StreamLimiter
from thalweg.flight.read.tickets import MAX_TICKET_BYTES
from thalweg.ops.metrics import Metrics

_FILE = re.compile(r"^e(\d{6})-(\d{20})-(\d{20})\.parquet$")


def is_node_ticket(raw: bytes) -> bool:
    """A JSON ticket with a ``node`` key (every other ticket is a topic read)."""
    if not raw.startswith(b"{") or len(raw) > MAX_TICKET_BYTES:
        return False
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(body, dict) and "node" in body


class NodeReads:
    """Serves materialised nodes' lanes.

    Args:
        root: ``data_dir/nodes``.
        nodes: the materialised nodes now, name → the topic each derives from.
        url: the location put into endpoints.
    """

    def __init__(
        self,
        root: Path,
        nodes: Callable[[], dict[str, str]],
        url: str,
        *,
        metrics: Metrics,
        streams: StreamLimiter,
    ) -> None:
        self._root = root
        self._nodes = nodes
        self._url = url
        self._metrics = metrics
        self._streams = streams

    def list_flights(self, context: fl.ServerCallContext) -> Iterator[fl.FlightInfo]:
        caller = principal_of(context)
        for name, topic in sorted(self._nodes().items()):
            if caller.may("read", topic):
                yield self._info(name, None)

    def get_flight_info(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.FlightInfo:
        name = self._readable(context, node_of(descriptor))
        return self._info(name, None)

    def do_get(self, context: fl.ServerCallContext, raw: bytes) -> fl.FlightDataStream:
        try:
            body = json.loads(raw)
            name = body["node"]
            parts = body.get("partitions")
            unknown = set(body) - {"node", "partitions", "v"}
            if not isinstance(name, str) or unknown:
                raise ValueError(f"unknown keys {sorted(unknown)}" if unknown else "node")
            if parts is not None and not all(isinstance(p, int) for p in parts):
                raise ValueError("partitions")
        except (ValueError, KeyError, TypeError) as exc:
            raise TicketError(
                f'a node ticket is {{"node": "<name>", "partitions": [..]}}: {exc}'
            ) from exc
        name = self._readable(context, name)
        files = self._files(name, parts)
        schema = _schema(files)
        active = self._metrics.flight_active_streams
        slot = self._streams.acquire(caller_key(context), on_release=active.dec)
        active.inc()

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                for f in files:
                    table = pq.read_table(f).replace_schema_metadata(None)
                    for batch in _shaped(table, schema).to_batches(max_chunksize=64 * 1024):
                        self._metrics.flight_rows.labels("do_get").inc(batch.num_rows)
                        self._metrics.flight_bytes.labels("do_get").inc(batch.nbytes)
                        yield batch
            finally:
                slot.release()

        gen = batches()
        weakref.finalize(gen, slot.release)  # a stream cancelled before its first batch
        return fl.GeneratorStream(schema, refusing(gen, "do_get"))

    def get_schema(
        self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor
    ) -> fl.SchemaResult:
        name = self._readable(context, node_of(descriptor))
        return fl.SchemaResult(_schema(self._files(name, None)))

    def _readable(self, context: fl.ServerCallContext, name: str) -> str:
        topic = self._nodes().get(name)
        if topic is None or not principal_of(context).may("read", topic):
            raise TicketError(f"unknown node {name!r}")
        return name

    def _files(self, name: str, partitions: list[int] | None) -> list[Path]:
        """The node's files of the topic it derives from now (a lane left from an
        earlier ``from`` is another topic's, not served), by partition, epoch, start."""
        topic_dir = self._root / name / f"topic={quote(self._nodes()[name], safe='')}"
        out: list[tuple[int, int, int, Path]] = []
        for pdir in sorted(topic_dir.glob("partition=*")):
            partition = int(pdir.name.removeprefix("partition="))
            if partitions is not None and partition not in partitions:
                continue
            for f in pdir.iterdir():
                m = _FILE.match(f.name)
                if m:
                    out.append((partition, int(m[1]), int(m[2]), f))
        return [f for *_, f in sorted(out)]

    def _info(self, name: str, partitions: list[int] | None) -> fl.FlightInfo:
        files = self._files(name, partitions)
        schema = _schema(files)
        rows = sum(pq.read_metadata(f).num_rows for f in files)
        ticket = json.dumps({"node": name}).encode()
        endpoint = fl.FlightEndpoint(ticket, [self._url])
        descriptor = fl.FlightDescriptor.for_path("nodes", name)
        return fl.FlightInfo(schema, descriptor, [endpoint], rows, -1)


def node_of(descriptor: fl.FlightDescriptor) -> str:
    path = [text(p) for p in descriptor.path]
    if len(path) != 2 or path[0] != "nodes" or not path[1]:
        raise TicketError(f"unknown descriptor path {path!r}; use ['nodes', <node>]")
    return str(path[1])


def is_node_descriptor(descriptor: fl.FlightDescriptor) -> bool:
    return (
        descriptor.descriptor_type == fl.DescriptorType.PATH
        and len(descriptor.path) >= 1
        and text(descriptor.path[0]) == "nodes"
    )


def _schema(files: list[Path]) -> pa.Schema:
    if not files:
        return pa.schema([])
    schemas = [pq.read_schema(f).remove_metadata() for f in files]
    schemas = [s for s in schemas if len(s)]
    if not schemas:
        return pa.schema([])
    return pa.unify_schemas(schemas, promote_options="permissive")


def _shaped(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with every column of ``schema`` (missing ones null), in its order."""
    columns = [
        table.column(f.name).cast(f.type)
        if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)
