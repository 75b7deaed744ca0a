"""The lanes as SQL tables: schema ``decoded``, ``raw`` or ``dlq``, one table per topic,
and ``latest``: each topic's decoded rows folded to one per record key (docs/cdc.md).

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

import datetime as dt
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from datafusion import DataFrame, SessionContext

from thalweg.errors import InvariantError, TicketError
from thalweg.flight.errors import UnavailableError
from thalweg.flight.read.latest import fold_input, fold_latest
from thalweg.flight.read.nodes import node_rows, shaped
from thalweg.flight.read.plan import ReadPlan, output_schema, plan_read
from thalweg.flight.read.stream import read_stream, shape_live
from thalweg.flight.read.tickets import ReadTicket
from thalweg.flight.sql.metadata import TableEntry
from thalweg.flight.sql.selection import EVERYTHING, Selection
from thalweg.group.owners import OwnerDirectory
from thalweg.lane.layout import SQL_SNAPSHOTS_DIR, Lane, Segment
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.lane.read.reader import leaf_index, offset_slice
from thalweg.lane.read.shape import fit_stream_schema
from thalweg.records.columns import MetadataPolicy
from thalweg.recovery.views import NodeViews

LANES: dict[str, Lane] = {"decoded": Lane.DECODED, "raw": Lane.RAW, "dlq": Lane.DLQ}
"""SQL schema name → lane."""
NODES = "nodes"  # the pipeline's nodes, one table each
LATEST = "latest"  # per topic, the newest decoded row of each record key

STALE_SNAPSHOT_S = 24 * 3600.0
SCHEMA_TTL_S = 1.0


class LaneTables:
    """Which tables exist for a caller, their schemas, and snapshots of their rows."""

    def __init__(
        self,
        catalog: LaneCatalog,
        owners: OwnerDirectory | None = None,
        nodes: NodeViews | None = None,
    ) -> None:
        self._catalog = catalog
        self._owners = owners
        self._nodes = nodes
        self.columns = catalog.columns
        self.scratch = catalog.scratch_root / SQL_SNAPSHOTS_DIR
        self._lock = threading.Lock()
        self._entries: tuple[float, list[TableEntry]] | None = None

    def partitions(self, topic: str) -> list[int]:
        return self._catalog.partitions(topic)

    def entries(self, may_read: Callable[[str], bool]) -> list[TableEntry]:
        """Every table of a topic the caller may read; the others do not exist for it."""
        return [e for e in self._all_entries() if may_read(e.source)]

    def schema_names(self) -> list[str]:
        """The SQL schemas: the lanes, and ``nodes`` when the pipeline has nodes."""
        return [*LANES, LATEST, *([NODES] if self._nodes is not None else [])]

    def _all_entries(self) -> list[TableEntry]:
        """Every table, remembered for :data:`SCHEMA_TTL_S`: a query is planned two or
        three times (prepare, GetFlightInfo, DoGet), and a topic's schema comes from
        segment footers when no decoder of this gateway knows it."""
        now = time.monotonic()
        with self._lock:
            if self._entries is not None and now - self._entries[0] < SCHEMA_TTL_S:
                return self._entries[1]
        out = []
        for topic in self._catalog.topics():
            for name, lane in LANES.items():
                schema = self.schema(lane, topic)
                if schema is not None:
                    out.append(TableEntry(name, topic, schema))
                    if lane is Lane.DECODED:
                        out.append(TableEntry(LATEST, topic, schema))
        for node, info in (self._nodes.nodes() if self._nodes is not None else {}).items():
            schema = self._nodes.open(node).schema() if self._nodes is not None else None
            if schema is not None:  # a sidecar's output is known from its answers only
                out.append(TableEntry(NODES, node, schema, info.topic))
        with self._lock:
            self._entries = (now, out)
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
        return Snapshot(self, self.scratch / uuid.uuid4().hex)


class Snapshot:
    """The files and live rows one query reads; :meth:`close` removes its links."""

    def __init__(self, tables: LaneTables, directory: Path) -> None:
        self._catalog = tables._catalog
        self._owners = tables._owners
        self._nodes = tables._nodes
        self.directory = directory
        self._tables = 0
        self.segments_read = 0  # files linked: what the selections left to read

    def frame(
        self,
        ctx: SessionContext,
        lane: Lane,
        topic: str,
        schema: pa.Schema,
        selection: Selection = EVERYTHING,
    ) -> DataFrame:
        """The table's rows as a DataFrame of ``ctx``: durable history, then live rows;
        only the partitions, segments and live entries ``selection`` keeps."""
        catalog = self._catalog
        ticket = ReadTicket(topic=topic, lane=lane, metadata=MetadataPolicy.LOCATOR)
        plan = ReadPlan(ticket, schema, pa.schema([]), (), schema)
        files: list[Path] = []
        live: list[pa.Table] = []
        off = catalog.columns.position
        for p in catalog.partitions(topic):
            if not selection.keeps_partition(p):
                continue
            self._check_here(topic, p)
            if lane is Lane.DLQ:  # dead letters are history only, as in do_get
                dead = catalog.segments(Lane.DLQ, topic, p)
                files += [s.path for s in self._selected(dead, selection)]
                continue
            entries = catalog.live_entries(topic, p)  # first: see the module doc
            durable = catalog.durable_end(topic, p)
            segments = [s for s in catalog.segments(Lane.RAW, topic, p) if s.first < durable]
            start = max([durable, *(s.last + 1 for s in segments)])
            files += _lane_files(catalog, lane, topic, p, self._selected(segments, selection))
            for entry in entries:
                if not selection.keeps_positions(entry.first, entry.last):
                    continue
                lo, hi = offset_slice(entry.raw, off, start, None)
                if hi > lo:
                    live.append(shape_live(catalog, plan, entry, lo, hi))
        self.segments_read += len(files)
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

    def latest_frame(
        self, ctx: SessionContext, topic: str, schema: pa.Schema, selection: Selection
    ) -> DataFrame:
        """The topic's latest view (``flight/read/latest.py``): its decoded rows up to
        the durable end and the live tail folded to each record key's newest, deleted
        keys absent; held in memory for the query (about one row per key). Only the
        table's columns and the fold's are read, as for a ``do_get`` of the view (every
        metadata column, headers and all, made it 1.7x slower)."""
        catalog = self._catalog
        parts = [p for p in catalog.partitions(topic) if selection.keeps_partition(p)]
        for p in parts:
            self._check_here(topic, p)
        if not parts:
            return ctx.from_arrow(schema.empty_table())
        columns = catalog.columns
        ticket = ReadTicket(topic=topic, partitions=parts, metadata=MetadataPolicy.ALL)
        full, payload = output_schema(catalog, ticket)
        # The query was planned with a schema a moment old: a field the topic no longer
        # has (its decoder gone with a rebalance) is not asked for, and comes as nulls.
        sent = pa.schema([f for f in schema if full.get_field_index(f.name) >= 0])
        ticket = fold_input(ticket, sent, columns, payload)
        rows = fold_latest(
            read_stream(catalog, plan_read(catalog, ticket), lambda: False),
            columns,
            values=columns.value in schema.names,
        )
        table = schema.empty_table() if rows is None else fit_stream_schema(rows, schema)
        return ctx.from_arrow(table)

    def node_frame(
        self, ctx: SessionContext, node: str, schema: pa.Schema, selection: Selection
    ) -> DataFrame:
        """A pipeline node's rows, as a ``do_get`` of the node reads them (its own lane
        when materialised, else derived from the lanes now): durable history only, held
        in memory for the query — node lanes are not hard-linked."""
        if self._nodes is None:
            raise InvariantError("self._nodes is not set")
        view = self._nodes.open(node)

        def partitions() -> list[int]:
            return [p for p in view.partitions() if selection.keeps_partition(p)]

        tables = [shaped(t, schema) for t in node_rows(view, partitions, False, lambda: False)]
        rows = pa.concat_tables(tables) if tables else schema.empty_table()
        return ctx.from_arrow(rows)

    def _check_here(self, topic: str, partition: int) -> None:
        """Refuse a partition another gateway of the group ingests into a ``data_dir``
        this one does not share: answering without it would be a silently partial
        result. With a shared ``data_dir`` its durable history is read here (its live
        tail is at its owner)."""
        if self._owners is None or self._owners.shared_lane:
            return
        owner = self._owners.owned_elsewhere(topic, partition)
        if owner is not None:
            raise UnavailableError(
                f"{topic}[{partition}] is ingested by the gateway at {owner}, whose data_dir "
                "this one does not share: run the query there, filter "
                "_twg_source_partition to this gateway's partitions, or give the group one "
                "shared data_dir (docs/flight-sql.md)"
            )

    def _selected(self, segments: list[Segment], selection: Selection) -> list[Segment]:
        """The segments that can hold selected rows: positions from their names,
        timestamps from their footers' statistics (read only when the query bounds
        them)."""
        kept = [s for s in segments if selection.keeps_positions(s.first, s.last)]
        if selection.ts_lo_ms is None and selection.ts_hi_ms is None:
            return kept
        ts = self._catalog.columns.timestamp
        return [s for s in kept if selection.keeps_times(*_time_span(s.path, ts))]

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


def _time_span(path: Path, column: str) -> tuple[int | None, int | None]:
    """Earliest and latest ``column`` value of a segment in epoch milliseconds, from its
    footer; ``(None, None)`` when the statistics do not say."""
    meta = pq.ParquetFile(path).metadata
    idx = leaf_index(meta, column)
    if idx is None:
        return None, None
    lows, highs = [], []
    for rg in range(meta.num_row_groups):
        stats = meta.row_group(rg).column(idx).statistics
        if stats is None or not stats.has_min_max:
            return None, None
        lows.append(_ms(stats.min))
        highs.append(_ms(stats.max))
    if not lows or None in lows or None in highs:
        return None, None
    return min(x for x in lows if x is not None), max(x for x in highs if x is not None)


def _ms(value: object) -> int | None:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp() * 1000)
    return value if isinstance(value, int) else None


def _lane_files(
    catalog: LaneCatalog, lane: Lane, topic: str, partition: int, segments: list[Segment]
) -> list[Path]:
    """The files of ``segments`` in ``lane``: a decoded file has its raw twin's name."""
    if lane is Lane.RAW:
        return [s.path for s in segments]
    return [catalog.twin(lane, topic, partition, s) for s in segments]
