"""What a sink reads from the lanes: a window of positions as rows and spans.

Rows come from the decoded lane (each decoded segment is its raw twin decoded; a twin
missing after a failed write is decoded again from raw first, when a decoder is at
hand), with the raw lane's metadata columns a sink asks for (``metadata``) matched by
position — or from the raw lane for ``raw = true`` — or, for a sink below a
materialised node, from that node's lane (``node``): the node's rows as it wrote them,
its files standing for segments. A span counts every position the lane accounts for: a
dead-lettered record, a transaction marker, an offset compaction removed, a record a
node filtered out is covered without a row.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from thalweg.codecs.base import ArrowDecoder
from thalweg.lane.coverage import scan_coverage
from thalweg.lane.layout import Lane, LaneLayout, Segment
from thalweg.lane.read.reader import offset_slice
from thalweg.lane.writer import SegmentWriter
from thalweg.pipeline.redecode import redecode
from thalweg.records.columns import MetadataColumns
from thalweg.sinks.base import CoverageKey, Span
from thalweg.sinks.node_lane import node_files, node_ranges

Transform = Callable[[pa.Table, str, int, Segment], pa.Table]


class SpanReader:
    """Reads windows of one sink's lane (not thread-safe: one feeder's worker at a time).

    Args:
        raw: read the raw lane instead of the decoded lane.
        metadata: raw-lane metadata columns (without the prefix) added to decoded rows.
        decoder_for, writer: rebuild a missing decoded twin (None: wait for it).
        transform: applied to each segment's rows with where they come from (topic,
            partition, segment) — a node chain: the rows it derives, with their
            records' locators, in position order.
        node: read this materialised node's lane (under ``data_dir``, by default the
            layout's root) instead of the topic's.
    """

    def __init__(
        self,
        layout: LaneLayout,
        columns: MetadataColumns,
        *,
        raw: bool,
        metadata: list[str],
        decoder_for: Callable[[str], ArrowDecoder | None] | None = None,
        writer: SegmentWriter | None = None,
        transform: Transform | None = None,
        node: str | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self.node = node
        self._data_dir = data_dir if data_dir is not None else layout.root
        self.layout = layout
        self.columns = columns
        self.raw = raw
        self.metadata = metadata
        self._decoder_for = decoder_for
        self._writer = writer
        self._transform = transform
        self._last: tuple[Path, pa.Table] | None = None

    def lane_ranges(self, topic: str, partition: int, epoch: int) -> list[tuple[int, int]]:
        """What the lane this reader reads holds of a partition's ``epoch``."""
        if self.node is not None:
            return node_ranges(self._data_dir, self.node, topic, partition, epoch)
        return scan_coverage(self.layout, topic, partition).ranges

    def _segments(self, topic: str, partition: int, epoch: int) -> list[Segment]:
        if self.node is None:
            return self.layout.segments(Lane.RAW, topic, partition)
        files = node_files(self._data_dir, self.node, topic, partition)
        return [Segment(a, b - 1, path) for e, a, b, path in files if e == epoch and b > a]

    def forget(self) -> None:
        """Drop the segment kept between windows (at the end of a pass)."""
        self._last = None

    def window(
        self, key: CoverageKey, start: int, limit: int, gap_end: int
    ) -> tuple[list[tuple[pa.Table, Span]], int, str]:
        """Rows of ``[start, limit)`` segment by segment, each with the span it accounts
        for; the position reached; why it stopped short, if it did.

        ``[start, limit)`` lies inside the lane's coverage, so positions before the next
        segment (or up to ``limit`` when none starts before it) are skipped offsets the
        lane accounts for — compacted records, transaction markers, a Pulsar ledger's
        jump — and are covered by one empty span up to the next segment (or the gap's
        end), however wide, rather than waited for or walked window by window.
        """
        topic, partition, epoch = key
        items: list[tuple[pa.Table, Span]] = []
        pos = start
        skip_to = gap_end
        for seg in self._segments(topic, partition, epoch):
            if seg.last < pos:
                continue
            if seg.first >= limit:
                skip_to = min(seg.first, gap_end)
                break
            table = self._rows(topic, partition, seg)
            if table is None:
                return items, pos, f"{topic}[{partition}]: decoded twin of {seg.path.name} missing"
            span_end = min(limit, seg.last + 1)
            lo, hi = offset_slice(table, self.columns.position, pos, span_end)
            items.append((table.slice(lo, hi - lo), Span(topic, partition, epoch, pos, span_end)))
            pos = span_end
            if pos >= limit:
                break
        else:
            return items, pos, ""  # no segment reaches limit (the lane changed meanwhile)
        if pos < limit:
            items.append((pa.table({}), Span(topic, partition, epoch, pos, skip_to)))
            pos = skip_to
        return items, pos, ""

    def _rows(self, topic: str, partition: int, seg: Segment) -> pa.Table | None:
        """A segment's rows for the sink: the raw segment, or its decoded twin with the
        raw lane's metadata columns the decoded lane does not keep (``metadata``),
        matched by position. The last segment read is kept: a window boundary inside a
        segment would otherwise read it twice."""
        if self._last is not None and self._last[0] == seg.path:
            return self._last[1]
        if self.node is not None:
            table = pq.read_table(seg.path).replace_schema_metadata(None)
            if self._transform is not None:
                table = self._transform(table, topic, partition, seg)
        elif self.raw:
            table = pq.read_table(seg.path).replace_schema_metadata(None)
        else:
            twin = self.layout.partition_dir(Lane.DECODED, topic, partition) / seg.path.name
            if not twin.exists():
                decoder = self._decoder_for(topic) if self._decoder_for is not None else None
                if decoder is None or self._writer is None:
                    return None
                redecode(self._writer, decoder, self.columns, topic, partition, [seg])
            table = self._with_metadata(pq.read_table(twin).replace_schema_metadata(None), seg)
            table = _without_dead_letters(table, self.columns.decode_error)
            if self._transform is not None:
                table = self._transform(table, topic, partition, seg)
        self._last = (seg.path, table)
        return table

    def _with_metadata(self, decoded: pa.Table, seg: Segment) -> pa.Table:
        wanted = [
            self.columns.prefix + name
            for name in self.metadata
            if self.columns.prefix + name not in decoded.column_names
        ]
        if not wanted:
            return decoded
        pos = self.columns.position
        present = set(pq.read_schema(seg.path).names)
        raw = pq.read_table(seg.path, columns=[pos, *(c for c in wanted if c in present)])
        raw_pos, dec_pos = raw.column(pos).to_numpy(), decoded.column(pos).to_numpy()
        if np.array_equal(raw_pos, dec_pos):  # a row per record: the twins line up
            for name in wanted:
                if name in present:
                    decoded = decoded.append_column(name, raw.column(name))
            return decoded
        # Both ascending, the decoded positions a subset of the raw ones: one
        # searchsorted finds every row's raw twin.
        take = pa.array(np.searchsorted(raw_pos, dec_pos), pa.int64())
        for name in wanted:
            if name in present:
                decoded = decoded.append_column(name, raw.column(name).take(take))
        return decoded


def _without_dead_letters(table: pa.Table, error_column: str) -> pa.Table:
    """Rows that decoded. A record that failed keeps a row in the decoded lane (its
    payload null, its error set) but belongs to the dead-letter lane; the sink's span
    still covers its position."""
    if error_column not in table.column_names:
        return table
    errors = table.column(error_column)
    if errors.null_count != len(errors):
        table = table.filter(pc.is_null(errors))
    return table.drop_columns([error_column])
