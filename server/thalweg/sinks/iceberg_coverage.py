"""An Iceberg sink's record of what it holds (ADR 0022): per topic, partition and epoch
the ranges of positions, kept under ``thalweg.coverage.<sink>`` in the snapshot summary
of the commit that landed them and as a table property (which survives snapshot
expiry). The key names the sink, so two sinks writing one table, or another writer's
commits, never stand in for this sink's coverage."""

from __future__ import annotations

from pyiceberg.table import Table

from thalweg.sinks.base import Ranges
from thalweg.sinks.coverage_json import COVERAGE_PREFIX, decode_coverage, encode_coverage

__all__ = ["COVERAGE_PREFIX", "decode_coverage", "encode_coverage", "table_coverage"]


def table_coverage(table: Table, sink: str) -> Ranges:
    """``sink``'s coverage of ``table``: from the newest snapshot of the current history
    whose summary has it — so a table rolled back to an older snapshot claims what that
    snapshot holds, not what was committed after it — or, when expiry removed every such
    snapshot, from the table property written by the same commits."""
    key = COVERAGE_PREFIX + sink
    text = None
    snapshot = table.current_snapshot()
    while snapshot is not None:
        text = snapshot.summary.get(key) if snapshot.summary else None
        if text is not None or snapshot.parent_snapshot_id is None:
            break
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)
    if text is None:
        text = table.properties.get(key)
    return decode_coverage(text) if text is not None else {}
