"""A materialised node's own lane: its derived rows as Parquet, beside the raw lane.

``data_dir/nodes/<node>/topic=<t>/partition=<p>/e<epoch>-<start>-<end>.parquet``: one
file per flushed range of the topic's positions, named by that range and renamed into
place whole — the Arrow IPC sink's exactly-once scheme in Parquet (zstd), so DuckDB,
Spark or pyarrow read a node's lane like the raw one. It is re-derivable: delete it and
the node's feeder writes it again from the raw lane.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from thalweg.sinks.arrow_ipc import ArrowIpcSink

NODES_DIR = "nodes"


class NodeLaneSink(ArrowIpcSink):
    kind = "node_lane"
    suffix = ".parquet"

    def __init__(self, cfg: Any, data_dir: Path) -> None:
        super().__init__(cfg, data_dir)
        self.root = Path(data_dir) / NODES_DIR / cfg.node

    def _write_table(self, path: Path, table: pa.Table) -> None:
        pq.write_table(table, path, compression="zstd", compression_level=1)


def node_lane_config(node: str, topic: str, commit_interval_s: float = 5.0) -> SimpleNamespace:
    """The settings a node's lane is fed with (not a ``[[sinks]]`` table: the lane is
    the node's own, named ``node:<name>`` in /health, metrics and the coverage store)."""
    return SimpleNamespace(
        name=f"node:{node}",
        node=node,
        topics=[topic],
        raw=False,
        path=None,
        commit_interval_s=commit_interval_s,
        max_buffered_rows=500_000,
        metadata=["source_timestamp", "source_key", "ingest_ts"],
    )
