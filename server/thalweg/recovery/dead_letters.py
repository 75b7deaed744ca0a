"""Records a node refused, kept beside its lane — the dead-letter lane of a node.

``data_dir/nodes/<node>/dlq/topic=<t>/partition=<p>/<raw segment name>``: for each raw
segment a node refused records of, one Parquet file in the dead-letter lane's schema —
the whole raw record (payload bytes and every metadata column, so it can be replayed)
plus ``dlq_reason`` (``transform``, ``udf_exhausted``), ``dlq_error``, ``dlq_stage``
(``node:<name>``) and ``dlq_ts``.

Written before the sink's rows are handed over, so by the time the sink's coverage
advances over a refused record that record is durably somewhere. Named after the raw
segment and replaced whole, so it is exactly-once by construction: a replay of the
segment derives again and writes the same file over it — or removes it, when the records
are no longer refused (a sidecar that was fixed), since they then land in the sink.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from thalweg.lane.durable import fsync_dir, write_file_durably
from thalweg.lane.layout import Lane, LaneLayout, Segment
from thalweg.ops.metrics import Metrics
from thalweg.pipeline.dag import Rejected
from thalweg.records.columns import TIMESTAMP_US, MetadataColumns


class NodeDeadLetters:
    """Writes the refusals of the nodes of one chain, batch by batch (a raw segment, or
    a file of the materialised node's lane the chain reads)."""

    def __init__(
        self,
        layout: LaneLayout,
        nodes: Iterable[str],
        columns: MetadataColumns,
        metrics: Metrics | None = None,
    ) -> None:
        self.layout = layout
        self.columns = columns
        self.metrics = metrics
        self._nodes = list(nodes)

    def path(self, node: str, topic: str, partition: int, seg: Segment) -> Path:
        return self.layout.node_dead_letter_dir(node, topic, partition) / seg.path.name

    def record(
        self, topic: str, partition: int, seg: Segment, rejected: Iterable[Rejected]
    ) -> None:
        """Make each node's file for ``seg`` say exactly what it refused this time."""
        by_node: dict[str, list[Rejected]] = {}
        for r in rejected:
            by_node.setdefault(r.node, []).append(r)
        for node in self._nodes:
            path = self.path(node, topic, partition, seg)
            refused = by_node.get(node)
            if not refused:
                if path.exists():  # refused on an earlier derivation, not now: it landed
                    path.unlink()
                    fsync_dir(path.parent)
                continue
            wanted = np.concatenate([r.positions for r in refused])
            raw = raw_rows(
                self.layout, self.columns, topic, partition, int(wanted.min()), int(wanted.max())
            )
            self._write(path, self._rows(raw, node, refused))
            if self.metrics is not None:
                for r in refused:
                    self.metrics.node_dead_letters.labels(node, r.reason).inc(len(r.positions))

    def _rows(self, raw: pa.Table, node: str, refused: list[Rejected]) -> pa.Table:
        """The refused records' raw rows, in position order, with why."""
        positions = raw.column(self.columns.position).to_numpy()
        wanted = np.concatenate([r.positions for r in refused])
        reasons = np.concatenate([np.full(len(r.positions), r.reason, object) for r in refused])
        errors = np.concatenate(
            [
                np.array(r.errors, object)
                if r.errors
                else np.full(len(r.positions), r.error, object)
                for r in refused
            ]
        )
        # Raw positions ascend; a refused position is one of them.
        at = np.searchsorted(positions, wanted)
        found = (at < len(positions)) & (positions[np.minimum(at, len(positions) - 1)] == wanted)
        order = np.argsort(at[found], kind="stable")
        take = at[found][order]
        rows = raw.take(pa.array(take))
        return with_why(
            rows, self.columns, reasons[found][order], errors[found][order], f"node:{node}"
        )

    @staticmethod
    def _write(path: Path, table: pa.Table) -> None:
        """Whole or absent (``write_file_durably``)."""
        write_file_durably(
            path, lambda tmp: pq.write_table(table, tmp, compression="zstd", compression_level=1)
        )


def raw_rows(
    layout: LaneLayout, columns: MetadataColumns, topic: str, partition: int, low: int, high: int
) -> pa.Table:
    """The raw lane's rows of the segments holding positions ``low..high``."""
    parts = [
        pq.read_table(s.path).replace_schema_metadata(None)
        for s in layout.segments(Lane.RAW, topic, partition)
        if s.last >= low and s.first <= high
    ]
    if not parts:
        return columns.raw_schema.empty_table()
    return pa.concat_tables(parts, promote_options="permissive")


def with_why(
    rows: pa.Table, columns: MetadataColumns, reasons: object, errors: object, stage: str
) -> pa.Table:
    """Raw rows in the dead-letter lane's schema: why each was set aside, by whom, when."""
    n = rows.num_rows
    why = {
        "dlq_reason": pa.array(reasons, pa.string()),
        "dlq_error": pa.array(errors, pa.string()),
        "dlq_stage": pa.array([stage] * n, pa.string()),
        "dlq_ts": pa.array([datetime.now(UTC)] * n, TIMESTAMP_US),
    }
    for name, array in why.items():
        rows = rows.append_column(columns.stamped(name), array)
    return rows
