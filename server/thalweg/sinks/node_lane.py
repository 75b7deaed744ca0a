"""A materialised node's own lane: its derived rows as Parquet, beside the raw lane.

``data_dir/nodes/<node>/topic=<t>/partition=<p>/e<epoch>-<start>-<end>.parquet``: one
file per flushed range of the topic's positions, named by that range and renamed into
place whole — the Arrow IPC sink's exactly-once scheme in Parquet (zstd), so DuckDB,
Spark or pyarrow read a node's lane like the raw one. It is re-derivable: delete it and
the node's feeder writes it again from the raw lane.

The nodes and sinks below a materialised node read its lane rather than derive it again
(``recovery.reading``): the node is derived once, whatever reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from thalweg.lane.layout import NODES_DIR, LaneLayout
from thalweg.records.columns import MetadataColumns
from thalweg.records.ranges import merge_ranges
from thalweg.sinks.arrow_ipc import ArrowIpcSink

DEFAULT_METADATA = ("source_timestamp", "source_key", "ingest_ts")


def node_files(
    data_dir: Path, node: str, topic: str, partition: int
) -> list[tuple[int, int, int, Path]]:
    """A node lane's files of one partition (``LaneLayout.node_files``)."""
    return LaneLayout(data_dir).node_files(node, topic, partition)


def node_lane_schema(data_dir: Path, node: str, topic: str) -> pa.Schema | None:
    """The schema of a node lane's rows across its files of ``topic`` (None: no rows)."""
    layout = LaneLayout(data_dir)
    schemas = []
    for p in layout.partitions(topic):
        for *_, path in layout.node_files(node, topic, p):
            schema = pq.read_schema(path).remove_metadata()
            if len(schema):
                schemas.append(schema)
    if not schemas:
        return None
    return pa.unify_schemas(schemas, promote_options="permissive")


def node_ranges(
    data_dir: Path, node: str, topic: str, partition: int, epoch: int
) -> list[tuple[int, int]]:
    """The positions of ``epoch`` a node's lane holds, merged."""
    files = node_files(data_dir, node, topic, partition)
    return merge_ranges([(a, b) for e, a, b, _ in files if e == epoch])


class NodeLaneSink(ArrowIpcSink["NodeLaneSettings"]):
    kind = "node_lane"
    suffix = ".parquet"

    def __init__(
        self, cfg: NodeLaneSettings, data_dir: Path, columns: MetadataColumns | None = None
    ) -> None:
        super().__init__(cfg, data_dir, columns)
        self.root = Path(data_dir) / NODES_DIR / cfg.node

    def _write_table(self, path: Path, table: pa.Table) -> None:
        pq.write_table(table, path, compression="zstd", compression_level=1)

    def _read_file(self, path: Path) -> pa.Table:
        return pq.read_table(path)


@dataclass(frozen=True)
class NodeLaneSettings:
    """The settings a node's lane is fed with (not a ``[[sinks]]`` table: the lane is
    the node's own, named ``node:<name>`` in /health, metrics and the coverage store);
    the fields the feeder asks of a sink's config."""

    name: str
    node: str
    topics: list[str]
    metadata: list[str]
    commit_interval_s: float = 5.0
    raw: bool = False
    path: None = None
    max_paths: int = 1  # a node's lane is never routed
    max_buffered_rows: int = 500_000
    commit_rows: int | None = None
    commit_bytes: int | None = None

    def read_metadata(self) -> list[str]:
        """The raw metadata columns the lane's rows are read with: its ``metadata``."""
        return list(self.metadata)


def node_lane_config(
    node: str,
    topic: str,
    commit_interval_s: float = 5.0,
    metadata: list[str] | None = None,
) -> NodeLaneSettings:
    """A node's lane settings. ``metadata``: the raw lane's metadata columns it keeps —
    what the sinks fed from it ask for, beside the defaults."""
    return NodeLaneSettings(
        name=f"node:{node}",
        node=node,
        topics=[topic],
        commit_interval_s=commit_interval_s,
        metadata=sorted({*DEFAULT_METADATA, *(metadata or [])}),
    )
