"""Records a sink's destination refused for good — the sink's dead-letter lane.

``data_dir/refused/<sink>/dlq/topic=<t>/partition=<p>/<first>-<last>.parquet``: the
whole raw record (payload bytes and every metadata column, so it can be replayed) plus
``dlq_reason`` ``sink_refused``, ``dlq_error`` (the destination's message), ``dlq_stage``
(``sink:<name>``) and ``dlq_ts``. A record lands here only when the destination refuses
its values (``SinkRefusedError``: a NUL in a Postgres ``text``, a ``uint64`` past
2**63-1), never for an outage, and before the sink's coverage advances over it — so it
is durably somewhere the moment the sink moves past it.

The lane holds each position once, by construction rather than by file name: a write
leaves out every position some file of the partition already holds, so a replay that
finds the same refusal again (a crash between this write and the coverage's) adds
nothing. Files are named by the positions they hold, not after raw segments: the
feeder finds refusals window by window, and compaction renames segments.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from thalweg.lane.durable import TMP_MARK, write_file_durably
from thalweg.lane.layout import Lane, LaneLayout, segment_name
from thalweg.ops.metrics import Metrics
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.dead_letters import raw_rows, with_why

log = logging.getLogger(__name__)

REASON = "sink_refused"


class SinkDeadLetters:
    """The dead-letter lane of sink ``sink`` (one writer: the sink's feeder, which
    holds the sink's feeder lock)."""

    def __init__(
        self,
        layout: LaneLayout,
        sink: str,
        columns: MetadataColumns,
        metrics: Metrics | None = None,
    ) -> None:
        self.layout = layout
        self.sink = sink
        self.columns = columns
        self.metrics = metrics

    def held(self, topic: str, partition: int) -> np.ndarray:
        """The positions the lane holds of a partition, ascending (a position twice
        would be a fault ``twg verify`` names; here it is listed once per file)."""
        segments = self.layout.refused(self.sink).segments(
            Lane.DLQ, topic, partition, retained=False, contained=True
        )
        found = [
            pq.read_table(seg.path, columns=[self.columns.position]).column(0).to_numpy()
            for seg in segments
        ]
        return np.sort(np.concatenate(found)) if found else np.zeros(0, np.int64)

    def record(self, topic: str, partition: int, positions: np.ndarray, errors: list[str]) -> int:
        """Set the raw records at ``positions`` aside with the destination's message
        for each; durable on return. The records already in the lane are left out; the
        number written.

        Raises:
            OSError: the file could not be written (the feeder retries the flush: the
                positions are not covered until this returned).
        """
        directory = self.layout.refused_dir(self.sink, topic, partition)
        _remove_interrupted(directory)
        order = np.argsort(positions, kind="stable")
        wanted = np.asarray(positions, np.int64)[order]
        why = np.asarray(errors, object)[order]
        wanted, first = np.unique(wanted, return_index=True)
        why = why[first]
        new = ~np.isin(wanted, self.held(topic, partition))
        wanted, why = wanted[new], why[new]
        if not len(wanted):
            return 0
        raw = raw_rows(self.layout, self.columns, topic, partition, int(wanted[0]), int(wanted[-1]))
        have = raw.column(self.columns.position).to_numpy()
        at = np.searchsorted(have, wanted)
        ok = (at < len(have)) & (have[np.minimum(at, len(have) - 1)] == wanted)
        if not ok.all():
            # Retention removed them from the raw lane meanwhile: nothing left to keep.
            log.warning(
                "sink %s: %d refused records of %s[%d] are no longer in the raw lane",
                self.sink,
                int((~ok).sum()),
                topic,
                partition,
            )
        rows = with_why(
            raw.take(pa.array(at[ok])),
            self.columns,
            np.full(int(ok.sum()), REASON, object),
            why[ok],
            f"sink:{self.sink}",
        )
        if rows.num_rows:
            path = directory / segment_name(int(wanted[ok][0]), int(wanted[ok][-1]))
            write_file_durably(
                path,
                lambda tmp: pq.write_table(rows, tmp, compression="zstd", compression_level=1),
            )
            if self.metrics is not None:
                self.metrics.sink_dead_letters.labels(self.sink).inc(rows.num_rows)
        return int(rows.num_rows)


def _remove_interrupted(directory: Path) -> None:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if TMP_MARK in name:
            (directory / name).unlink(missing_ok=True)
