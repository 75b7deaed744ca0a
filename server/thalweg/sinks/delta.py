"""The Delta Lake sink (``kind = "delta"``): a Delta table per topic, through delta-rs
(the ``deltalake`` package, ADR 0040).

**Exactly once.** Each flush is one Delta commit per topic, and the commit carries the
sink's coverage: its ``commitInfo`` holds ``thalweg.coverage.<sink>`` (the ranges of
every partition the table holds, ``sinks/coverage_json.py``) and an application
transaction per partition (``twg:<sink>:<topic>:<partition>``, version the last
position landed) — the marker Delta's own streaming writers use, read back by
``DeltaTable.transaction_version``. The coverage is read back from the newest commit
that has it (an ``OPTIMIZE`` or ``VACUUM`` commit in between carries none), so a crash
after the commit loses nothing and one before it wrote nothing visible: a flush that
covers ranges without rows (dead letters only) is a commit with no files. A dropped
table (its directory removed) takes its coverage with it and is written again whole.
A routed ``table`` (``"{tenant}_orders"``) lands a flush table by table and then in a
control record (``sinks/delta_routes.py``).

**Upsert** (``mode = "upsert"``): each flush is folded to one row per key
(``sinks/fold.py``) and merged — a newer row replaces the key's row, a delete removes
it, an older one (a replay) changes nothing — in one commit with the coverage.

**Types.** What delta-rs maps itself it maps (a 16-byte record id becomes ``binary``,
millisecond timestamps microseconds); an unsigned 64-bit value past 2**63-1 has no Delta
type and is refused (the record is set aside, ``on_refused``). Added columns evolve the
table (``schema_mode = "merge"``); a widened or otherwise changed column is a schema
error naming it (``degraded``; ``sinks/schema_change.py``): delta-rs would cast the rows
into the old type silently, and cannot widen a column.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc

from thalweg.config.sinks import DeltaSinkConfig
from thalweg.records import unavailable
from thalweg.records.columns import MetadataColumns
from thalweg.records.ranges import merge_ranges
from thalweg.records.unavailable import UNAVAILABLE
from thalweg.sinks import delta_docs, delta_log, delta_routes, routes, schema_change
from thalweg.sinks.base import (
    BufferedSink,
    Landed,
    Ranges,
    SinkSchemaError,
    SinkUnavailableError,
)
from thalweg.sinks.contract import Capabilities, Held
from thalweg.sinks.coverage_json import COVERAGE_PREFIX, encode_coverage
from thalweg.sinks.fold import DELETED, deleted, newest_per_key

log = logging.getLogger(__name__)


class DeltaSink(BufferedSink[DeltaSinkConfig]):
    """Appends (or merges) each flush into ``<uri>/<table>`` with its coverage."""

    kind = "delta"
    guarantee = "exactly-once"
    capabilities: ClassVar[Capabilities] = Capabilities(
        upsert=True,
        routing=True,
        refuses_values=True,
        reads_back=True,
        rebuilds_dropped=True,
        detects_deleted_rows=True,
        evolves_schema=True,
        widens_types=False,
        describes_tables=True,
    )

    def __init__(
        self, cfg: DeltaSinkConfig, data_dir: Path, columns: MetadataColumns | None = None
    ) -> None:
        super().__init__(cfg, data_dir, columns)
        self._key = cfg.row_key(self.columns.source("key"))
        self._upsert = cfg.mode == "upsert"
        self._keep_value = "source_value" in cfg.metadata
        self._covered: dict[str, Ranges] = {}  # per topic, as its table records it
        self._commits: dict[str, int] = {}  # per table URI, since its last compaction
        self.routed = routes.routed(cfg.table)  # a table per row value (delta_routes)
        self._tables: set[str] = set()  # a routed sink's tables
        self._described: set[str] = set()  # table URIs whose docs this process synced

    # -- where ------------------------------------------------------------------------

    @property
    def base(self) -> str:
        """Where the tables are: ``uri``, or ``data_dir/sinks/<name>``."""
        uri = self.cfg.uri or str(self.data_dir / "sinks" / self.name)
        return uri.removesuffix("/")

    def table_uri(self, topic: str) -> str:
        return f"{self.base}/{routes.safe_name(self.cfg.table.replace('{topic}', topic))}"

    def storage_options(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.cfg.storage_options.items()}

    def _load(self, topic: str) -> Any:
        """The topic's table now, or None before its first commit (or once dropped)."""
        return delta_routes.load(self.table_uri(topic), self.storage_options())

    # -- the contract -----------------------------------------------------------------

    def holds(self, wanted: list[str]) -> Held:
        """The coverage each table's commits record and the ``wanted`` columns of its
        rows (None: no table for the topic)."""
        if self.routed:
            return self._held_routed(wanted)
        coverage: Ranges = {}
        rows: dict[str, pa.Table | None] = {}
        for topic in self.cfg.topics:
            table = self._load(topic)
            rows[topic] = None if table is None else _read(table, wanted)
            if table is not None:
                coverage.update(delta_log.coverage(table, self.name))
        return Held(coverage, rows)

    def _held_routed(self, wanted: list[str]) -> Held:
        """The control record's coverage, and the rows of every table it names that the
        template can name for each topic (None: no such table)."""
        options = self.storage_options()
        names, coverage = delta_routes.opened(self.base, self.name, self.cfg.topics, options)
        rows: dict[str, pa.Table | None] = {}
        for topic in self.cfg.topics:
            like = routes.pattern(self.cfg.table, topic)
            parts = [
                _read(t, wanted)
                for n in sorted(names)
                if like.match(n) and (t := delta_routes.load(f"{self.base}/{n}", options))
            ]
            rows[topic] = pa.concat_tables(parts, promote_options="permissive") if parts else None
        return Held(coverage, rows)

    def rebuild_step(self) -> str:
        return (
            "remove the table's directory (its commit log holds the coverage, which goes "
            "with it)"
            + (f" and the control table {delta_routes.CONTROL}" if self.routed else "")
            + ", and run twg recover again: the table is written again whole"
        )

    # -- open and commit --------------------------------------------------------------

    def _open(self) -> Landed | None:
        ranges: Ranges = {}
        self._covered = {}
        try:
            if urlparse(self.base).scheme in ("", "file"):
                Path(urlparse(self.base).path or self.base).mkdir(parents=True, exist_ok=True)
            if self.routed:
                self._tables, ranges = delta_routes.opened(
                    self.base, self.name, self.cfg.topics, self.storage_options()
                )
            for topic in [] if self.routed else self.cfg.topics:
                table = self._load(topic)
                found = {} if table is None else delta_log.coverage(table, self.name)
                self._covered[topic] = found
                ranges.update(found)
        except OSError as exc:
            raise SinkUnavailableError(f"delta sink {self.name!r}: {exc}") from exc
        return Landed({k: merge_ranges(v) for k, v in ranges.items()})

    def _commit(self, rows: Mapping[str, list[pa.Table]], covered: Ranges) -> None:
        from deltalake.exceptions import DeltaError, SchemaMismatchError

        topics = sorted({k[0] for k in covered} | set(rows))
        by_topic = {
            t: _delta_types(pa.concat_tables(rows[t], promote_options="permissive"))
            for t in topics
            if rows.get(t)
        }
        uri = self.base
        try:
            if self.routed:
                self._commit_routed(by_topic, covered)
                return
            for topic in topics:
                uri = self.table_uri(topic)
                mine = {k: v for k, v in covered.items() if k[0] == topic}
                table = self._load(topic)
                # A table dropped under a running feeder took its record with it: a new
                # one claims only what it is made with (the recheck feeds the rest).
                known = self._covered.get(topic, {}) if table is not None else {}
                data = by_topic.get(topic)
                self._covered[topic] = self._land(uri, topic, table, data, mine, known)
        except SchemaMismatchError as exc:
            raise SinkSchemaError(f"delta table {uri}: the rows do not fit it: {exc}") from exc
        except (DeltaError, OSError) as exc:
            raise SinkUnavailableError(f"delta table {uri}: {_first_line(exc)}") from exc

    def _commit_routed(self, by_topic: Mapping[str, pa.Table], covered: Ranges) -> None:
        """Every table's rows first (refusing, by name, rows naming none), then each
        table in turn, less what its own coverage says it holds, and the control record
        once the last has landed (``sinks/delta_routes.py``)."""
        tables = routes.assign(
            by_topic,
            self.cfg.table,
            self._tables,
            self.cfg.max_tables,
            self.name,
            self.columns,
            deletes_name_nothing=self._upsert,
        )
        options = self.storage_options()
        for (name, topic), part in sorted(tables.items()):
            uri = f"{self.base}/{name}"
            mine = {k: v for k, v in covered.items() if k[0] == topic}
            table = delta_routes.load(uri, options)
            own = {} if table is None else delta_log.coverage(table, self.name)
            rest = routes.not_held(part, own, mine, topic, self.columns)
            self._land(uri, topic, table, rest if rest.num_rows else None, mine, own)
            self._tables.add(name)
        delta_routes.cover(self.base, self.name, covered, self._tables, options)

    def _land(
        self,
        uri: str,
        topic: str,
        table: Any,
        data: pa.Table | None,
        covered: Ranges,
        known: Ranges,
    ) -> Ranges:
        """One commit of ``data`` (None: no rows) of ``topic`` into the table at ``uri``
        (``table``, None before its first commit), its coverage ``known`` grown by
        ``covered``: the coverage it records now."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        merged = dict(known)
        for key, rs in covered.items():
            merged[key] = merge_ranges([*merged.get(key, []), *rs])
        props = CommitProperties(
            custom_metadata={COVERAGE_PREFIX + self.name: encode_coverage(merged)},
            app_transactions=[
                Transaction(f"twg:{self.name}:{t}:{p}", max(b for _, b in rs) - 1)
                for (t, p, _), rs in sorted(covered.items())
                if rs
            ],
        )
        if table is None and data is None:
            return merged  # nothing to make a table of: the spans had no rows
        if table is not None and data is not None:
            schema_change.refuse(  # delta-rs would cast the rows down silently
                pa.schema(table.schema().to_arrow()),
                data.schema,
                f"delta table {uri}",
                cannot_widen="delta-rs cannot widen a Delta column",
                applied="only added columns are applied to a Delta table",
            )
        before = set() if table is None else {f.name for f in table.schema().fields}
        if self._upsert and table is not None:
            self._merge(topic, table, data, props)
        else:
            if self._upsert and data is not None:
                data = self._newest(topic, data)
                data = data.filter(pc.invert(deleted(data)))
            write_deltalake(
                table if table is not None else uri,
                data if data is not None else _empty(table),
                mode="append",
                schema_mode="merge",
                storage_options=None if table is not None else self.storage_options(),
                commit_properties=props,
            )
        fresh = data is not None and (uri not in self._described or set(data.schema.names) - before)
        docs = self.table_docs(topic)
        if fresh and data is not None and docs.speaks_of(data.schema):  # made, grown, new
            delta_docs.describe(delta_routes.load(uri, self.storage_options()), docs, data.schema)
            self._described.add(uri)
        self._commits[uri] = self._commits.get(uri, 0) + 1
        every = self.cfg.compact_every_commits
        if every and self._commits[uri] >= every:
            self._commits[uri] = 0
            self._upkeep(uri)
        return merged

    def _upkeep(self, uri: str) -> None:
        """Bound the table's small files: a flush is a file per commit, so compact them
        (a commit of its own, with no coverage: ``delta_log.coverage`` steps over it) and vacuum
        what no recent version reads. A failure is logged, never a failed flush — the
        flush's commit has landed."""
        table = delta_routes.load(uri, self.storage_options())
        if table is None:
            return
        try:
            done = table.optimize.compact()
            gone = table.vacuum(
                retention_hours=self.cfg.vacuum_retention_hours,
                dry_run=False,
                enforce_retention_duration=False,
            )
        except Exception as exc:  # the rows are committed; the next round tries again
            log.warning("delta table %s: compaction failed: %s", uri, exc)
            return
        log.info(
            "delta table %s: compacted %s files into %s, vacuumed %d",
            uri,
            done.get("numFilesRemoved"),
            done.get("numFilesAdded"),
            len(gone),
        )

    def _newest(self, topic: str, data: pa.Table) -> pa.Table:
        return newest_per_key(
            data, self._key, topic, self.name, self.columns, keep_value=self._keep_value
        )

    def _merge(self, topic: str, table: Any, data: pa.Table | None, props: Any) -> None:
        """Each key's newest row of the flush merged in: newer than the table's row
        replaces it (or, a delete, removes it); an older one changes nothing."""
        if data is None:
            from deltalake import write_deltalake

            write_deltalake(table, _empty(table), mode="append", commit_properties=props)
            return
        newest = self._newest(topic, data)
        if unavailable.named(newest):
            newest = unavailable.from_held(
                newest,
                _held_rows(table, newest, self._key, self.columns.position),
                self._key,
                self.columns.position,
            )
        if DELETED not in newest.column_names:
            newest = newest.append_column(DELETED, pa.array([False] * newest.num_rows))
        pos = _q(self.columns.position)
        on = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in self._key)
        newer = f"s.{pos} > t.{pos}"
        gone = f"coalesce(s.{_q(DELETED)}, false)"
        (
            table.merge(
                newest,
                predicate=on,
                source_alias="s",
                target_alias="t",
                merge_schema=True,
                commit_properties=props,
            )
            .when_matched_delete(predicate=f"{gone} AND {newer}")
            .when_matched_update_all(predicate=f"NOT {gone} AND {newer}")
            .when_not_matched_insert_all(predicate=f"NOT {gone}")
            .execute()
        )

    def _close(self) -> None:
        self._covered = {}
        self._tables = set()


def _held_rows(table: Any, newest: pa.Table, key: list[str], position: str) -> pa.Table:
    """The table's rows of the keys whose newest row still names a column as
    unavailable: their key, position and those columns (as the table has them)."""
    asked = unavailable.unresolved(newest)
    names = {f.name for f in table.schema().fields}
    wanted = [c for c in [*key, position, *unavailable.named(newest), UNAVAILABLE] if c in names]
    if not asked.num_rows or any(k not in names for k in key):
        return newest.slice(0, 0)
    match = functools.reduce(
        operator.and_, [pc.field(k).isin(pc.unique(asked.column(k))) for k in key]
    )
    return table.to_pyarrow_dataset().to_table(columns=list(dict.fromkeys(wanted)), filter=match)


def _read(table: Any, wanted: list[str]) -> pa.Table:
    """The ``wanted`` columns ``table`` has, of all its rows."""
    names = {f.name for f in table.schema().fields}
    return table.to_pyarrow_table(columns=[c for c in wanted if c in names])


def _delta_types(table: pa.Table) -> pa.Table:
    """Unsigned 64-bit columns as Delta's ``long``, checked: a value past 2**63-1 raises
    ``ArrowInvalid`` (the records are refused, not wrapped)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_uint64(f.type):
            table = table.set_column(i, f.name, table.column(i).cast(pa.int64(), safe=True))
    return table


def _empty(table: Any) -> pa.Table:
    """No rows, in the table's schema: a commit that moves the coverage alone."""
    return pa.schema(table.schema().to_arrow()).empty_table()


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
