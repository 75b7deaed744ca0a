"""The lanes as SQL tables: schema ``decoded``, ``raw`` or ``dlq``, one table per topic.

A query reads a *snapshot* of each table it names, taken when it starts:

* history — the partition's durable segments, hard-linked into a directory of the
  query's own, so retention and compaction cannot delete a file the query is reading
  (the link keeps it until the query ends) and DataFusion reads them with its native
  Parquet scan, pruning segments and row groups by their statistics: a filter on
  ``_twg_source_partition``, the position or the timestamp skips the files whose
  min/max exclude it without reading their rows;
* the live tail — rows fetched but not yet durable, shaped as ``do_get`` shapes them.

The seam is exact for the reason it is in ``do_get`` (``flight.read.stream``): the live
entries are taken first, then the durable end; an entry leaves the tail only after its
segment is durable, so every position below the end is in a file and every position at
or above it is in the entries taken.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from datafusion import DataFrame, SessionContext

from thalweg.errors import TicketError
from thalweg.flight.read.plan import ReadPlan, output_schema
from thalweg.flight.read.stream import shape_live
from thalweg.flight.read.tickets import ReadTicket
from thalweg.flight.sql.metadata import TableEntry
from thalweg.lane.catalog import LaneCatalog
from thalweg.lane.layout import SQL_SNAPSHOTS_DIR, Lane, Segment
from thalweg.lane.reader import offset_slice
from thalweg.records.columns import MetadataPolicy

LANES: dict[str, Lane] = {"decoded": Lane.DECODED, "raw": Lane.RAW, "dlq": Lane.DLQ}
"""SQL schema name → lane."""

STALE_SNAPSHOT_S = 24 * 3600.0


class LaneTables:
    """Which tables exist for a caller, their schemas, and snapshots of their rows."""

    def __init__(self, catalog: LaneCatalog) -> None:
        self._catalog = catalog
        self.scratch = catalog.layout.root / SQL_SNAPSHOTS_DIR

    def entries(self, may_read: Callable[[str], bool]) -> list[TableEntry]:
        """Every table of a topic the caller may read; the others do not exist for it."""
        out = []
        for topic in self._catalog.topics():
            if not may_read(topic):
                continue
            for name, lane in LANES.items():
                schema = self.schema(lane, topic)
                if schema is not None:
                    out.append(TableEntry(name, topic, schema))
        return out

    def schema(self, lane: Lane, topic: str) -> pa.Schema | None:
        """The table's columns (None: the topic has no such table). The decoded table
        carries the payload, the locator and the decode error, as a ``do_get`` with
        ``metadata = "locator"``; the rest of a record's metadata is in ``raw``."""
        ticket = ReadTicket(topic=topic, lane=lane, metadata=MetadataPolicy.LOCATOR)
        try:
            return output_schema(self._catalog, ticket)[0]
        except TicketError:  # no decoded lane for this topic
            return None

    def sweep(self) -> None:
        """Remove snapshot directories a crashed gateway left (older than a day: one
        sharing this ``data_dir`` may still be running its queries)."""
        try:
            names = os.listdir(self.scratch)
        except FileNotFoundError:
            return
        for name in names:
            path = self.scratch / name
            try:
                old = time.time() - path.stat().st_mtime > STALE_SNAPSHOT_S
            except FileNotFoundError:
                continue
            if old:
                shutil.rmtree(path, ignore_errors=True)

    def snapshot(self) -> Snapshot:
        return Snapshot(self._catalog, self.scratch / uuid.uuid4().hex)


class Snapshot:
    """The files and live rows one query reads; :meth:`close` removes its links."""

    def __init__(self, catalog: LaneCatalog, directory: Path) -> None:
        self._catalog = catalog
        self.directory = directory
        self._tables = 0

    def frame(self, ctx: SessionContext, lane: Lane, topic: str, schema: pa.Schema) -> DataFrame:
        """The table's rows as a DataFrame of ``ctx``: durable history, then live rows."""
        catalog = self._catalog
        ticket = ReadTicket(topic=topic, lane=lane, metadata=MetadataPolicy.LOCATOR)
        plan = ReadPlan(ticket, schema, pa.schema([]), (), schema)
        files: list[Path] = []
        live: list[pa.Table] = []
        off = catalog.columns.position
        for p in catalog.partitions(topic):
            if lane is Lane.DLQ:  # dead letters are history only, as in do_get
                files += [s.path for s in catalog.layout.segments(Lane.DLQ, topic, p)]
                continue
            entries = catalog.live.entries_from(topic, p, 0)  # first: see the module doc
            durable = catalog.durable_end(topic, p)
            segments = [s for s in catalog.layout.segments(Lane.RAW, topic, p) if s.first < durable]
            files += _lane_files(catalog, lane, topic, p, segments)
            start = max([durable, *(s.last + 1 for s in segments)])
            for entry in entries:
                lo, hi = offset_slice(entry.raw, off, start, None)
                if hi > lo:
                    live.append(shape_live(catalog, plan, entry, lo, hi))
        frames = []
        if files:
            frames.append(ctx.read_parquet(str(self._link(files)), schema=schema))
        if live:
            frames.append(ctx.from_arrow(pa.concat_tables(live).cast(schema)))
        if not frames:
            return ctx.from_arrow(schema.empty_table())
        out = frames[0]
        for more in frames[1:]:
            out = out.union(more)
        return out

    def _link(self, files: list[Path]) -> Path:
        """Hard links to ``files`` in a directory of their own (a symbolic link where
        the file system refuses hard links; the file may then vanish mid-query)."""
        directory = self.directory / str(self._tables)
        self._tables += 1
        directory.mkdir(parents=True)
        for i, src in enumerate(files):
            dst = directory / f"{i:06d}.parquet"
            try:
                os.link(src, dst)
            except FileNotFoundError:
                raise  # retention removed it since it was listed: the query is retried
            except OSError:
                os.symlink(src, dst)
        return directory

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _lane_files(
    catalog: LaneCatalog, lane: Lane, topic: str, partition: int, segments: list[Segment]
) -> list[Path]:
    """The files of ``segments`` in ``lane``: a decoded file has its raw twin's name."""
    if lane is Lane.RAW:
        return [s.path for s in segments]
    directory = catalog.layout.partition_dir(Lane.DECODED, topic, partition)
    return [directory / s.path.name for s in segments]
