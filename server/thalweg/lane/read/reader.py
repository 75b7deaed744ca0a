"""History reads from the Parquet lanes: offset ranges, timestamp lookups."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from thalweg.errors import InvariantError
from thalweg.lane.layout import Lane, LaneLayout, Segment
from thalweg.lane.read.cache import SegmentCache
from thalweg.lane.read.shape import few_chunks
from thalweg.records.columns import MetadataColumns

BATCH_ROWS = 64 * 1024  # Flight is fastest at about 64k-row batches (PERFORMANCE-NOTES)


def offset_slice(
    table: pa.Table | pa.RecordBatch, column: str, start: int, end: int | None
) -> tuple[int, int]:
    """Row bounds of offsets in ``[start, end)`` (offsets ascend within a partition)."""
    offsets = table.column(column).to_numpy()
    lo = int(np.searchsorted(offsets, start, side="left"))
    hi = len(offsets) if end is None else int(np.searchsorted(offsets, end, side="left"))
    return lo, max(lo, hi)


class LaneReader:
    """Reads one partition's segments between two positions."""

    def __init__(
        self, layout: LaneLayout, columns: MetadataColumns, cache: SegmentCache | None = None
    ) -> None:
        self._layout = layout
        self._columns = columns
        self._cache = cache
        # topic -> (the newest decoded segment of each partition, their unified schema):
        # a read plans with it, and a footer read per partition per request showed in the
        # time to a read's first batch (about 5 ms over four partitions). A segment is
        # known by its path, size and mtime: a new epoch writes the same names again.
        self._schemas: dict[str, tuple[tuple[tuple[Path, int, int], ...], pa.Schema | None]] = {}

    def segments_between(self, topic: str, partition: int, start: int, end: int) -> list[Segment]:
        """Raw segments overlapping ``[start, end)`` — below the retention floor too while
        their files exist: the read's plan decided its range (``flight.read.plan``)."""
        return [
            s
            for s in self._layout.segments(Lane.RAW, topic, partition, retained=False)
            if s.last >= start and s.first < end
        ]

    def read_pairs(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        *,
        decoded: bool,
        with_raw: bool,
        wanted: set[str] | None = None,
        predicate: pc.Expression | None = None,
    ) -> Iterator[tuple[pa.Table | None, pa.Table | None]]:
        """Yield ``(raw, decoded)`` tables of ``[start, end)``, segment by segment.

        Only the rows in range are kept; the two tables of a pair hold the same rows.
        ``wanted`` limits the columns read from the segment (the position is always read
        from the file the rows are sliced by); ``predicate`` is pushed into the Parquet
        scan of the one file read — the caller passes it only when no twin has to stay
        row-aligned.
        """
        off = self._columns.position
        for seg in self.segments_between(topic, partition, start, end):
            dpath = self._layout.partition_dir(Lane.DECODED, topic, partition) / seg.path.name
            raw = dec = None
            if decoded:
                dec = self._read(dpath, wanted, None if with_raw else predicate)
            if dec is None:
                raw = self._read(seg.path, wanted, predicate)
            elif with_raw:
                # Projected too: the shaping step keeps only the columns the read asked
                # for (a latest view read the whole raw file, headers and all, to use
                # its key and value), and none the decoded twin holds (the same rows:
                # its position, partition and locators).
                twin = None if wanted is None else wanted - set(dec.column_names)
                raw = self._read(seg.path, twin, None, sliced=False)
            ref = dec if dec is not None else raw
            if ref is None:
                raise InvariantError("ref is not set")
            lo, hi = offset_slice(ref, off, start, end)
            if hi <= lo:
                continue
            yield (
                raw.slice(lo, hi - lo) if raw is not None else None,
                dec.slice(lo, hi - lo) if dec is not None else None,
            )

    def _read(
        self,
        path: Path,
        wanted: set[str] | None,
        predicate: pc.Expression | None,
        *,
        sliced: bool = True,
    ) -> pa.Table:
        """One segment file's rows: from the cache when it holds the file (projection and
        filter applied in memory), else from Parquet with both pushed into the scan.
        A projected read takes the position too when it is ``sliced`` by it."""
        cached = self._cache.get(path) if self._cache is not None else None
        if cached is not None:
            if predicate is not None:  # first: it may name columns the projection drops
                cached = cached.filter(predicate)
            if wanted is not None:
                cached = cached.select(self._present(cached.schema, wanted, sliced))
            return cached
        columns = None
        if predicate is None:
            # One open for the footer and the rows: read_schema and then read_table read
            # the footer twice and plan a dataset scan (~15 % of a projected read).
            with pq.ParquetFile(path) as file:
                if wanted is not None:
                    columns = self._present(file.schema_arrow, wanted, sliced)
                table = file.read(columns=columns)
        else:
            if wanted is not None:
                columns = self._present(pq.read_schema(path), wanted, sliced)
            table = pq.read_table(path, columns=columns, filters=predicate)
        table = table.replace_schema_metadata(None)
        if self._cache is not None and columns is None and predicate is None:
            self._cache.put(path, table)
        return table

    def _present(self, schema: pa.Schema, wanted: set[str], sliced: bool) -> list[str]:
        """The ``wanted`` columns a file has (a segment older than a field lacks it),
        and the position when the read is sliced by it."""
        off = self._columns.position if sliced else None
        return [c for c in schema.names if c in wanted or c == off]

    def offset_for_timestamp(self, topic: str, partition: int, ts_ms: int, end: int) -> int | None:
        """The first offset below ``end`` whose record timestamp is ``>= ts_ms``.

        Resolved from the lane, not the broker (some brokers answer ListOffsets wrongly),
        skipping segments whose footer statistics show no timestamp that late.
        """
        ts_col, off_col = self._columns.timestamp, self._columns.position
        for seg in self.segments_between(topic, partition, 0, end):
            meta = pq.ParquetFile(seg.path).metadata
            idx = leaf_index(meta, ts_col)
            maxima = []
            for rg in range(meta.num_row_groups if idx is not None else 0):
                stats = meta.row_group(rg).column(idx).statistics
                maxima.append(stats.max if stats is not None and stats.has_min_max else None)
            if maxima and all(m is not None and _epoch_ms(m) < ts_ms for m in maxima):
                continue
            table = pq.read_table(seg.path, columns=[off_col, ts_col])
            ts = table.column(ts_col).cast(pa.int64()).to_numpy(zero_copy_only=False)
            offsets = table.column(off_col).to_numpy()
            hits = np.flatnonzero((ts >= ts_ms) & (offsets < end))
            if len(hits):
                return int(offsets[hits[0]])
        return None

    def decoded_schema(self, topic: str) -> pa.Schema | None:
        """The union of the newest decoded segment's schema of every partition."""
        newest = []
        for partition in self._layout.partitions(topic):
            segs = self._layout.segments(Lane.DECODED, topic, partition)
            if segs:
                newest.append(segs[-1].path)
        try:
            key = tuple((p, *_identity(p)) for p in newest)
        except FileNotFoundError:  # replaced under us: read the footers afresh
            key = ()
        known = self._schemas.get(topic)
        if known is not None and known[0] == key:
            return known[1]
        schemas = [pq.read_schema(path) for path in newest]
        unified = (
            pa.unify_schemas(schemas, promote_options="permissive").remove_metadata()
            if schemas
            else None
        )
        if key or not newest:
            self._schemas[topic] = (key, unified)
        return unified


def _identity(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def leaf_index(meta: pq.FileMetaData, column: str) -> int | None:
    """The index of a top-level primitive column among a Parquet file's leaf columns
    (what row-group statistics are indexed by): not its Arrow field index once a nested
    column (the headers list) comes before it."""
    for i in range(meta.num_columns):
        if meta.schema.column(i).path == column:
            return i
    return None


def _epoch_ms(value: object) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, dt.datetime):
        return int(value.timestamp() * 1000)
    return int(str(value))


def rebatch(table: pa.Table) -> Iterator[pa.RecordBatch]:
    """Batches of at most :data:`BATCH_ROWS` rows, and not many tiny ones.

    A table read from Parquet comes in row-group chunks that are already about the right
    size, and copying them together would cost as much as a fifth of the read; only
    tables of many small chunks (the live tail's fetched batches) are combined first.
    """
    yield from few_chunks(table).to_batches(max_chunksize=BATCH_ROWS)
