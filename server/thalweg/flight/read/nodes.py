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
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq

from thalweg.errors import TicketError
from thalweg.flight.auth import principal_of
from thalweg.flight.descriptors import text
from thalweg.flight.read.tickets import MAX_TICKET_BYTES

_FILE = re.compile(r"^e(\d{6})-(\d{20})-(\d{20})\.parquet$")


def is_node_ticket(raw: bytes) -> bool:
    """A JSON ticket with a ``node`` key (every other ticket is a topic read)."""
    if not raw.startswith(b"{") or len(raw) > MAX_TICKET_BYTES:
        return False
    try:
        return "node" in json.loads(raw)
    except ValueError:
        return False


class NodeReads:
    """Serves materialised nodes' lanes.

    Args:
        root: ``data_dir/nodes``.
        nodes: the materialised nodes now, name → the topic each derives from.
        url: the location put into endpoints.
    """

    def __init__(self, root: Path, nodes: Callable[[], dict[str, str]], url: str) -> None:
        self._root = root
        self._nodes = nodes
        self._url = url

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

        def batches() -> Iterator[pa.RecordBatch]:
            for f in files:
                table = pq.read_table(f).replace_schema_metadata(None)
                yield from _shaped(table, schema).to_batches(max_chunksize=64 * 1024)

        return fl.GeneratorStream(schema, batches())

    def _readable(self, context: fl.ServerCallContext, name: str) -> str:
        topic = self._nodes().get(name)
        if topic is None or not principal_of(context).may("read", topic):
            raise TicketError(f"unknown node {name!r}")
        return name

    def _files(self, name: str, partitions: list[int] | None) -> list[Path]:
        out: list[tuple[int, int, Path]] = []
        for pdir in sorted(self._root.glob(f"{_glob_escape(name)}/topic=*/partition=*")):
            partition = int(pdir.name.removeprefix("partition="))
            if partitions is not None and partition not in partitions:
                continue
            for f in pdir.iterdir():
                m = _FILE.match(f.name)
                if m:
                    out.append((partition, int(m[2]), f))
        return [f for _, _, f in sorted(out)]

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


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[\]])", r"[\1]", unquote(name))
