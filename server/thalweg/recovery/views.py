"""A pipeline node as something to read: its rows, partition by partition, from the lanes.

Every node is readable, materialised or not. A materialised node's rows are its own lane
as written; any other node's are derived at read time the way its sinks are fed — the
nearest materialised lane above it (or the topic's decoded lane) through the nodes below
it (``recovery.reading``), so a read and a sink see the same rows. Records a node
refuses are left out of a read (the node's feeders dead-letter them); a strict quality
node that stops makes the read fail with its message.

Positions are the topic's: a reader can resume a partition at the position it reached,
which is how the Flight server follows a node (``thalweg.flight.read.nodes``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from thalweg.config.models import ThalwegConfig
from thalweg.errors import InvariantError
from thalweg.lane.epochs import current_epoch
from thalweg.lane.layout import LaneLayout, Segment
from thalweg.lane.read.reader import LaneReader
from thalweg.pipeline.dag import Chain, Dag
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import configured_udfs
from thalweg.recovery.reading import SpanReader
from thalweg.sidecars import SidecarClient
from thalweg.sinks.node_lane import DEFAULT_METADATA, node_lane_schema

WINDOW = 200_000  # positions per read window


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the Flight server lists for a node."""

    name: str
    topic: str
    materialised: bool


class NodeViews:
    """The nodes of a configuration, each readable (a :class:`NodeView` per read)."""

    def __init__(self, cfg: ThalwegConfig, layout: LaneLayout, columns: MetadataColumns) -> None:
        self._cfg = cfg
        self._layout = layout
        self._columns = columns
        self._dag = Dag.of(cfg.pipeline)

    def nodes(self) -> dict[str, NodeInfo]:
        dag = self._dag
        return {
            n.name: NodeInfo(n.name, dag.source_topic(n.name), dag.materialised(n.name))
            for n in dag.nodes
        }

    def open(self, name: str) -> NodeView:
        """A reader of ``name`` (one per stream: it holds a chain and its state)."""
        return NodeView(self._cfg, self._dag, name, self._layout, self._columns)


class NodeView:
    """One node's rows, for one reader (not thread-safe)."""

    def __init__(
        self,
        cfg: ThalwegConfig,
        dag: Dag,
        name: str,
        layout: LaneLayout,
        columns: MetadataColumns,
    ) -> None:
        self.name = name
        self.topic = dag.source_topic(name)
        self.layout = layout
        self.above = dag.materialised_above(name, include_self=True)
        self._chain: Chain | None = None
        if self.above != name:
            self._chain = Chain(
                dag,
                name,
                columns,
                sidecar_for=lambda n: SidecarClient(n, columns),
                udfs=configured_udfs(cfg),
                below=self.above,
            )
        self._columns = columns
        self._reader = SpanReader(
            layout,
            columns,
            raw=False,
            metadata=list(DEFAULT_METADATA),
            transform=self._derive if self._chain is not None else None,
            node=self.above,
        )

    def _derive(self, rows: pa.Table, topic: str, partition: int, seg: Segment) -> pa.Table:
        if self._chain is None:
            raise InvariantError("self._chain is not set")
        return self._chain.apply(rows).rows

    def partitions(self) -> list[int]:
        return self.layout.partitions(self.topic)

    def ranges(self, partition: int) -> tuple[int, list[tuple[int, int]]]:
        """The partition's current epoch and the positions readable now."""
        epoch = current_epoch(self.layout, self.topic, partition)
        return epoch, self._reader.lane_ranges(self.topic, partition, epoch)

    def schema(self) -> pa.Schema | None:
        """The node's rows' schema when it is known without reading rows: a
        materialised node's files, or the chain planned against its input."""
        if self._chain is None:
            return node_lane_schema(self.layout.root, self.name, self.topic)
        if self.above is not None:
            source = node_lane_schema(self.layout.root, self.above, self.topic)
        else:
            decoded = LaneReader(self.layout, self._columns).decoded_schema(self.topic)
            source = None
            if decoded is not None:
                raw = self._columns.raw_schema
                fields = [f for f in decoded if f.name != self._columns.decode_error]
                fields += [
                    raw.field(self._columns.prefix + m)
                    for m in DEFAULT_METADATA
                    if self._columns.prefix + m not in decoded.names
                ]
                source = pa.schema(fields)
        return None if source is None else self._chain.plan(source)

    def rows(
        self, partition: int, epoch: int, start: int, end: int, stop: Callable[[], bool]
    ) -> Iterator[pa.Table]:
        """The rows derived from positions ``[start, end)`` (inside the readable
        ranges), window by window, until ``stop()``."""
        pos = start
        while pos < end and not stop():
            items, reached, _ = self._reader.window(
                (self.topic, partition, epoch), pos, min(end, pos + WINDOW), end
            )
            for table, _span in items:
                if table.num_rows:
                    yield table
            if reached <= pos:
                return
            pos = reached
        self._reader.forget()
