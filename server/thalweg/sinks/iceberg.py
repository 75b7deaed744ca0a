"""Iceberg tables through pyiceberg: one table per topic, exactly-once across crashes.

Every flush is one commit per table that appends the data files and records the sink's
whole coverage of the table (``sinks/iceberg_coverage.py``) in the same commit, and on
open the sink answers with the table's record — trusted over the coverage store, so a
crash between the Iceberg commit and the store's write replays nothing (ADR 0022). A
routed ``table`` (``"{tenant}_orders"``) lands a flush table by table and then in a
control record (``sinks/iceberg_routes.py``).

With ``mode = "upsert"`` the table holds one row per ``key`` (docs/cdc.md): each flush
folds its rows to each key's newest (lane position), leaves out keys the table holds from
a newer position, and in one transaction deletes the keys' rows (copy-on-write) and
appends the newest rows that are not deletes — the coverage in the same commits.

Schema: the table is created from the first rows (decoded columns and the ``_twg_``
columns); later rows may add columns or widen types (int → long, float → double), which
``union_by_name`` applies before the append; anything else is a
:class:`SinkSchemaError` (the sink goes ``degraded``, the rows stay in the raw lane).
Arrow types Iceberg lacks are mapped first: timestamps of s/ms precision to µs,
unsigned integers to the next signed width.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
)
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.upsert_util import create_match_filter

from thalweg.config.sinks import IcebergSinkConfig
from thalweg.records.columns import MetadataColumns
from thalweg.records.ranges import merge_ranges, subtract_ranges
from thalweg.sinks import glue_tags, iceberg_routes, routes
from thalweg.sinks.base import (
    BufferedSink,
    Landed,
    Ranges,
    SinkSchemaError,
    SinkUnavailableError,
)
from thalweg.sinks.contract import Capabilities, Held
from thalweg.sinks.fold import deleted, newest_per_key
from thalweg.sinks.iceberg_coverage import COVERAGE_PREFIX, encode_coverage, table_coverage
from thalweg.sinks.iceberg_tables import create_table, evolve, newer_than_held, write_files
from thalweg.sinks.iceberg_types import iceberg_types

log = logging.getLogger(__name__)

_COMMIT_TRIES = 5


class IcebergSink(BufferedSink[IcebergSinkConfig]):
    kind = "iceberg"
    guarantee = "exactly-once"
    capabilities = Capabilities(
        upsert=True,
        routing=True,
        refuses_values=True,
        reads_back=True,
        rebuilds_dropped=True,
        detects_deleted_rows=True,
        evolves_schema=True,
        widens_types=True,
        describes_tables=True,
    )

    def __init__(
        self, cfg: IcebergSinkConfig, data_dir: Path, columns: MetadataColumns | None = None
    ) -> None:
        super().__init__(cfg, data_dir, columns)
        self._catalog: Catalog | None = None
        self._upsert = getattr(cfg, "mode", "append") == "upsert"
        self._key: list[str] = cfg.row_key(self.columns.source("key")) if self._upsert else []
        self._keep_value = "source_value" in cfg.metadata  # else dropped (sinks/fold.py)
        self.routed = routes.routed(cfg.table)  # a table per row value (iceberg_routes)
        self._tables: set[str] = set()
        # Per table: the coverage this sink knows of its record (read at open, then
        # what each of its commits covered). Positions the record holds beyond it were
        # landed by another writer of this sink (``_append``).
        self._known: dict[str, Ranges] = {}

    # -- catalog and tables ------------------------------------------------------------

    def catalog_properties(self) -> dict[str, str]:
        """pyiceberg's properties; the embedded default is SQLite + a local warehouse
        under ``data_dir/sinks/<name>``."""
        c = self.cfg.catalog
        home = (self.data_dir / "sinks" / self.name).resolve()
        props = {"type": c.type, **c.properties}
        props.update({k: v.get_secret_value() for k, v in c.secret_properties.items()})
        if c.type == "sql":
            props["uri"] = c.uri or f"sqlite:///{home / 'catalog.db'}"
        elif c.uri:
            props["uri"] = c.uri
        if c.token is not None:
            props["token"] = c.token.get_secret_value()
        if c.credential is not None:
            props["credential"] = c.credential.get_secret_value()
            if c.uri and "oauth2-server-uri" not in props:
                # The spec's token endpoint, named: pyiceberg's implicit fallback to it is
                # deprecated and warns on every load.
                props["oauth2-server-uri"] = c.uri.rstrip("/") + "/v1/oauth/tokens"
        if c.warehouse:
            props["warehouse"] = c.warehouse
        elif c.type == "sql":
            props["warehouse"] = (home / "warehouse").as_uri()
        return props

    def _connect(self) -> Catalog:
        if self._catalog is None:
            if self.cfg.catalog.type == "sql" and not self.cfg.catalog.uri:
                (self.data_dir / "sinks" / self.name / "warehouse").mkdir(
                    parents=True, exist_ok=True
                )
            catalog = load_catalog(self.name, **self.catalog_properties())
            with contextlib.suppress(NamespaceAlreadyExistsError):
                catalog.create_namespace(self.cfg.namespace)
            self._catalog = catalog
        return self._catalog

    def holds(self, wanted: list[str]) -> Held:
        """Each table's coverage and the ``wanted`` columns of its rows
        (``sinks/iceberg_held.py``)."""
        from thalweg.sinks.iceberg_held import read_held

        return read_held(self, wanted)

    def rebuild_step(self) -> str:
        step = "stop the sink's feeder, drop the table" + (
            " and the control table <namespace>._thalweg_coverage"
            if routes.routed(self.cfg.table)
            else ""
        )
        return step + " (its coverage is in its snapshots), and run twg recover again"

    def identifier(self, topic: str) -> str:
        name = re.sub(r"[^A-Za-z0-9_]", "_", self.cfg.table.replace("{topic}", topic))
        return f"{self.cfg.namespace}.{name}"

    def table(self, topic: str) -> Table | None:
        """The table of ``topic`` (an unrouted sink), None before its first rows."""
        return self._load(self.identifier(topic))

    def _load(self, ident: str) -> Table | None:
        try:
            return self._connect().load_table(ident)
        except NoSuchTableError:
            return None

    # -- the contract ------------------------------------------------------------------

    def _open(self) -> Landed | None:
        self._catalog = None
        self._known = {}
        ranges: Ranges = {}
        try:
            if self.routed:  # the control record (sinks/iceberg_routes.py)
                self._tables, ranges = iceberg_routes.opened(self._connect(), self.cfg)
            for topic in [] if self.routed else self.cfg.topics:
                table = self.table(topic)
                if table is not None:
                    found = table_coverage(table, self.name)
                    self._known[self.identifier(topic)] = found
                    ranges.update({k: v for k, v in found.items() if k[0] == topic})
        except Exception as exc:  # the catalog or the warehouse is not reachable
            self._catalog = None
            raise SinkUnavailableError(f"iceberg catalog of sink {self.name!r}: {exc}") from exc
        return Landed(ranges)

    def _commit(self, rows: Mapping[str, list[pa.Table]], covered: Ranges) -> None:
        topics = {k[0] for k in covered} | set(rows)
        by_topic = {
            t: iceberg_types(pa.concat_tables(rows[t], promote_options="permissive"))
            for t in sorted(topics)
            if rows.get(t)
        }
        if self.routed:
            self._commit_routed(by_topic, covered)
            return
        for topic in sorted(topics):
            mine = {k: v for k, v in covered.items() if k[0] == topic}
            try:
                self._append(topic, self.identifier(topic), by_topic.get(topic), mine)
            except (SinkSchemaError, SinkUnavailableError):
                raise
            except Exception as exc:
                self._catalog = None
                raise SinkUnavailableError(f"iceberg sink {self.name!r}, {topic!r}: {exc}") from exc

    def _commit_routed(self, by_topic: Mapping[str, pa.Table], covered: Ranges) -> None:
        """Every table's rows first (refusing, by name, rows naming none), then each
        table in turn, and the control record once the last has landed
        (sinks/iceberg_routes.py)."""
        cfg = self.cfg
        tables = routes.assign(
            by_topic,
            cfg.table,
            self._tables,
            cfg.max_tables,
            self.name,
            self.columns,
            deletes_name_nothing=self._upsert,
        )
        try:
            for (name, topic), part in sorted(tables.items()):
                mine = {k: v for k, v in covered.items() if k[0] == topic}
                self._land_routed(topic, name, part, mine)
            iceberg_routes.cover(self._connect(), cfg.namespace, self.name, covered)
        except (SinkSchemaError, SinkUnavailableError):
            raise
        except Exception as exc:
            self._catalog = None
            raise SinkUnavailableError(f"iceberg sink {self.name!r}: {exc}") from exc

    def _land_routed(self, topic: str, name: str, rows: pa.Table, covered: Ranges) -> None:
        """One routed table's rows of a flush, less those its own coverage says it holds
        (landed by an attempt that stopped before the control record)."""
        ident = f"{self.cfg.namespace}.{name}"
        table = self._load(ident)
        own = {} if table is None else table_coverage(table, self.name)
        rows = routes.not_held(rows, own, covered, topic, self.columns)
        self._append(topic, ident, rows if rows.num_rows else None, covered)
        self._tables.add(name)

    def _append(self, topic: str, ident: str, data: pa.Table | None, covered: Ranges) -> None:
        """Write the data files once, then commit them with the coverage, retrying the
        commit (not the write) when another writer committed first.

        Rows at positions the table's record holds beyond what this sink knows of it
        (read at open, then written by its own commits) are left out, at the first load
        and after every conflict: a writer of this sink that committed part of this
        flush meanwhile (a gateway that lost its partitions and did not know it yet)
        never makes them land twice. Positions it knew of are not left out: a recheck
        feeds rows deleted behind the sink's back again at positions its record still
        claims."""
        table = self._load(ident)
        if table is None:
            if data is None:
                return  # nothing to create a table from; the spans had no rows
            table = self._create(ident, data.schema, topic)
        if self._upsert:
            self._fold(topic, ident, table, data, covered)
            return
        known = self._known.get(ident, {})
        data = self._not_landed(table, known, topic, data, covered)
        files = self._files(table, data, ident, topic)
        for attempt in range(_COMMIT_TRIES):
            # The coverage is recomputed from the table on every try: a concurrent
            # writer's commit must not be overwritten by a stale summary.
            merged = table_coverage(table, self.name)
            for key, rs in covered.items():
                merged[key] = merge_ranges([*merged.get(key, []), *rs])
            record = {COVERAGE_PREFIX + self.name: encode_coverage(merged)}
            try:
                with table.transaction() as tx:
                    tx.set_properties(record)
                    update = tx.update_snapshot(snapshot_properties=record)
                    with update.fast_append() as append:
                        for f in files:
                            append.append_data_file(f)
                # What this sink fed (not what others landed in partitions it has not
                # fed yet: those are left out when it feeds them).
                self._known[ident] = {
                    k: merge_ranges([*known.get(k, []), *covered.get(k, [])])
                    for k in {*known, *covered}
                }
                return
            except CommitFailedException as exc:
                if attempt == _COMMIT_TRIES - 1:
                    raise
                log.info(
                    "iceberg sink %s: %s moved before the commit (%s); retrying from a "
                    "fresh load (%d/%d)",
                    self.name,
                    ident,
                    exc,
                    attempt + 1,
                    _COMMIT_TRIES - 1,
                )
                spec, schema = table.spec().spec_id, table.schema().schema_id
                table = self._connect().load_table(ident)
                fresh = self._not_landed(table, known, topic, data, covered)
                moved = table.spec().spec_id != spec or table.schema().schema_id != schema
                if fresh is not data or moved:
                    # Part of the flush landed meanwhile, or the files were laid out for
                    # another spec or schema: write again (the old files are orphans).
                    data = fresh
                    files = self._files(table, data, ident, topic)

    def _not_landed(
        self, table: Table, known: Ranges, topic: str, data: pa.Table | None, covered: Ranges
    ) -> pa.Table | None:
        """``data`` less the rows at positions the table's record holds beyond ``known``
        (the same table when none; None when all)."""
        if data is None:
            return None
        now = table_coverage(table, self.name)
        landed = {
            k: gone for k, rs in now.items() if (gone := subtract_ranges(rs, known.get(k, [])))
        }
        if not landed:
            return data
        rest = routes.not_held(data, landed, covered, topic, self.columns)
        if rest.num_rows == data.num_rows:
            return data
        log.warning(
            "iceberg sink %s: %s already holds %d of this flush's rows (another writer of "
            "this sink committed them); writing the other %d",
            self.name,
            table.name(),
            data.num_rows - rest.num_rows,
            rest.num_rows,
        )
        return rest if rest.num_rows else None

    def _files(self, table: Table, data: pa.Table | None, ident: str, topic: str) -> list[DataFile]:
        if data is None:
            return []
        self._evolve(table, data.schema, ident, topic)
        return write_files(table, data)

    def _evolve(self, table: Table, schema: pa.Schema, ident: str, topic: str) -> None:
        """``evolve``, with the topic's docs; on Glue the tags as the table's resource
        tags too, whenever its properties were written."""
        docs = self.table_docs(topic)
        if evolve(table, schema, ident, docs) and docs.tags and self.cfg.catalog.type == "glue":
            glue_tags.tag(self._connect(), ident, dict(docs.tags))

    def _fold(
        self, topic: str, ident: str, table: Table, data: pa.Table | None, covered: Ranges
    ) -> None:
        """``mode = "upsert"``: one transaction that deletes the rows of every key this
        flush's newest rows name, appends those that are not deletes, and records the
        coverage; retried whole when another writer committed first."""
        newest = (
            None
            if data is None
            else newest_per_key(
                data, self._key, topic, self.name, self.columns, keep_value=self._keep_value
            )
        )
        if newest is not None:
            self._evolve(table, newest.schema, ident, topic)
        for attempt in range(_COMMIT_TRIES):
            merged = table_coverage(table, self.name)
            for key, rs in covered.items():
                merged[key] = merge_ranges([*merged.get(key, []), *rs])
            record = {COVERAGE_PREFIX + self.name: encode_coverage(merged)}
            fresh, replaced = (
                (None, None)
                if newest is None
                else newer_than_held(table, newest, self._key, self.columns.position)
            )
            kept = None if fresh is None else fresh.filter(pc.invert(deleted(fresh)))
            try:
                with table.transaction() as tx:
                    tx.set_properties(record)
                    if replaced is not None and replaced.num_rows:
                        gone = create_match_filter(replaced, self._key)
                        tx.delete(gone, snapshot_properties=record)
                    if kept is not None and kept.num_rows:
                        tx.append(kept, snapshot_properties=record)
                    else:  # the coverage still moves on, in a commit of its own
                        tx.update_snapshot(snapshot_properties=record).fast_append().commit()
                return
            except CommitFailedException:
                if attempt == _COMMIT_TRIES - 1:
                    raise
                table = self._connect().load_table(ident)

    def _create(self, ident: str, schema: pa.Schema, topic: str) -> Table:
        docs = self.table_docs(topic)
        table, made = create_table(self._connect(), ident, schema, self.cfg.partition_by, docs)
        if made:
            log.info("iceberg sink %s created %s", self.name, ident)
            if docs.tags and self.cfg.catalog.type == "glue":
                glue_tags.tag(self._connect(), ident, dict(docs.tags))
            self._known[ident] = {}
        else:  # another writer created it first (a replica, this sink's twin)
            log.info("iceberg sink %s: %s was created by another writer", self.name, ident)
        return table

    def _close(self) -> None:
        self._catalog = None
