"""Arrow IPC files: one file per flushed contiguous range, named by that range.

Like the raw lane, a file's name is its coverage — ``e<epoch>-<start>-<end>.arrow``
under ``topic=<t>/partition=<p>/`` (``end`` exclusive) — and it appears whole (temp →
fsync → rename → directory fsync) or not at all. So the names are the sink's own record
of coverage, trusted over the coverage store on open: a crash after a rename and before
the store's write replays nothing, and nothing is ever written twice (exactly-once).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import quote, unquote

import pyarrow as pa

from thalweg.lane.durable import TMP_MARK, ensure_dir, write_file_durably
from thalweg.records.columns import MetadataColumns
from thalweg.records.ranges import merge_ranges
from thalweg.sinks import ipc_routes, routes
from thalweg.sinks.base import (
    BufferedSink,
    CoverageKey,
    Landed,
    Ranges,
    SinkSettings,
    SinkUnavailableError,
    Span,
)
from thalweg.sinks.contract import Capabilities, Held

_FILE_RE = ipc_routes.FILE


def file_name(epoch: int, start: int, end: int, suffix: str = ".arrow") -> str:
    return f"e{epoch:06d}-{start:020d}-{end:020d}{suffix}"


class IpcSettings(SinkSettings, Protocol):
    """What an Arrow IPC sink's settings have: a ``[[sinks]]`` table of kind
    ``arrow_ipc`` (``ArrowIpcSinkConfig``) or a pipeline node's lane settings."""

    @property
    def path(self) -> Path | None: ...

    @property
    def max_paths(self) -> int: ...


S = TypeVar("S", bound=IpcSettings)


class ArrowIpcSink(BufferedSink[S]):
    kind = "arrow_ipc"
    guarantee = "exactly-once"
    capabilities = Capabilities(
        upsert=False,
        routing=True,
        refuses_values=False,
        reads_back=True,
        rebuilds_dropped=True,
        detects_deleted_rows=True,
    )
    suffix = ".arrow"

    def __init__(self, cfg: S, data_dir: Path, columns: MetadataColumns | None = None) -> None:
        super().__init__(cfg, data_dir, columns)
        # A routed path ("out/{tenant}"): the files in the directories the rows name,
        # the coverage in a control directory (sinks/ipc_routes.py).
        self._template = str(cfg.path) if cfg.path is not None else ""
        self.routed = routes.routed(self._template)
        self._dirs: set[str] = set()
        self.root = (
            ipc_routes.control_dir(self._template)
            if self.routed
            else Path(cfg.path)
            if cfg.path is not None
            else self.data_dir / "sinks" / cfg.name
        )
        self._spans_rows: list[tuple[pa.Table, Span]] = []
        self._committing: list[tuple[pa.Table, Span]] = []

    async def write(self, rows: pa.Table, span: Span) -> None:
        # Kept with their spans (a file per range); the base class keeps the spans.
        self._spans_rows.append((rows, span))
        self._spans.append(span)
        self.buffered_rows += rows.num_rows

    def holds(self, wanted: list[str]) -> Held:
        """The coverage from the files' names (a routed sink's from its control
        directory) and the ``wanted`` columns of every file's rows.

        Raises:
            OSError: a file that does not read, named (for the runbook).
        """
        roots = (
            [self.root, *map(Path, ipc_routes.dirs_of(self._template))]
            if self.routed
            else [self.root]
        )
        coverage: Ranges = {}
        tables: dict[str, list[pa.Table]] = {t: [] for t in self.cfg.topics}
        for tdir in sorted(t for r in roots for t in r.glob("topic=*")):
            topic = unquote(tdir.name[6:])
            for pdir in sorted(tdir.glob("partition=*")):
                partition = int(pdir.name[10:])
                for name in sorted(os.listdir(pdir)):
                    m = _FILE_RE.match(name)
                    if not m or not name.endswith(self.suffix):
                        continue
                    if tdir.parent == self.root:
                        coverage.setdefault((topic, partition, int(m[1])), []).append(
                            (int(m[2]), int(m[3]))
                        )
                    try:
                        table = self._read_file(pdir / name)
                    except (OSError, pa.ArrowException) as exc:
                        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                        raise OSError(f"{pdir / name}: {first}") from exc
                    if table.num_columns and topic in tables:
                        tables[topic].append(
                            table.select([c for c in wanted if c in table.column_names])
                        )
        rows: dict[str, pa.Table | None] = {
            t: pa.concat_tables(parts, promote_options="permissive") if parts else None
            for t, parts in tables.items()
        }
        for t, table in rows.items():
            if table is None and any(k[0] == t for k in coverage):
                rows[t] = pa.table({c: pa.array([], pa.int64()) for c in wanted[:2]})
        return Held({k: merge_ranges(v) for k, v in coverage.items()}, rows)

    def _read_file(self, path: Path) -> pa.Table:
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_file(source).read_all()

    def rebuild_step(self) -> str:
        if self.routed:
            return (
                "remove the damaged files and, for each, the file of the same name under the "
                "control directory _thalweg_coverage below the path's fixed part (those "
                "files are the coverage), and run twg recover again"
            )
        return "remove the damaged files (their names are the coverage) and run twg recover again"

    def partition_dir(self, topic: str, partition: int) -> Path:
        return self.root / f"topic={quote(topic, safe='')}" / f"partition={partition}"

    def _open(self) -> Landed | None:
        self._spans_rows = []
        ranges: Ranges = {}
        try:
            ensure_dir(self.root)
            if self.routed:
                self._dirs = set(ipc_routes.dirs_of(self._template))
            for tdir in sorted(self.root.glob("topic=*")):
                topic = unquote(tdir.name[6:])
                for pdir in sorted(tdir.glob("partition=*")):
                    partition = int(pdir.name[10:])
                    for name in os.listdir(pdir):
                        if TMP_MARK in name:
                            (pdir / name).unlink(missing_ok=True)
                            continue
                        m = _FILE_RE.match(name)
                        if m and name.endswith(self.suffix):
                            key = (topic, partition, int(m[1]))
                            ranges.setdefault(key, []).append((int(m[2]), int(m[3])))
        except OSError as exc:
            raise SinkUnavailableError(f"{self.root}: {exc}") from exc
        return Landed({k: merge_ranges(v) for k, v in ranges.items()})

    def _take(self) -> None:
        self._committing, self._spans_rows = self._spans_rows, []

    def _commit_alone(
        self,
        items: list[tuple[pa.Table, Span]],
        rows: Mapping[str, list[pa.Table]],
        covered: Ranges,
    ) -> None:
        self._committing = list(items)
        self._commit(rows, covered)

    def _commit(self, rows: Mapping[str, list[pa.Table]], covered: Ranges) -> None:
        items, self._committing = self._committing, []
        by_key: dict[CoverageKey, list[tuple[pa.Table, Span]]] = {}
        for table, span in items:
            by_key.setdefault(span.key, []).append((table, span))
        files = [
            (key, start, end, pa.concat_tables(parts, promote_options="permissive"))
            for key, ranges in covered.items()
            for start, end in ranges
            if (parts := [t for t, s in by_key.get(key, []) if start <= s.start and s.end <= end])
        ]
        if self.routed:  # the ceiling first: a refusal writes nothing
            whole: dict[str, list[pa.Table]] = {}
            for (topic, _, _), _, _, table in files:
                whole.setdefault(topic, []).append(table)
            by_topic = {
                t: pa.concat_tables(v, promote_options="permissive") for t, v in whole.items()
            }
            cfg = self.cfg
            named = routes.assign(
                by_topic,
                self._template,
                self._dirs,
                cfg.max_paths,
                self.name,
                self.columns,
                whole=False,
            )
            self._dirs.update(name for name, _ in named)
        try:
            for key, start, end, table in files:
                if self.routed:
                    self._write_routed(key, start, end, table)
                # Routed, the control record: an empty file with the range's name.
                self._write_file(key, start, end, pa.table({}) if self.routed else table)
        except OSError as exc:
            raise SinkUnavailableError(f"{self.root}: {exc}") from exc

    def _write_routed(self, key: CoverageKey, start: int, end: int, table: pa.Table) -> None:
        """A range's rows into the directories they name, less what a directory already
        holds (a replay of a range cut before its control record)."""
        topic, partition, epoch = key
        parts, _, _ = routes.split(table, self._template, topic, whole=False)
        for d, rows in sorted(parts.items()):
            pdir = Path(d) / f"topic={quote(topic, safe='')}" / f"partition={partition}"
            own = {key: ipc_routes.held(pdir, epoch, self.suffix)}
            fresh = routes.not_held(rows, own, {key: [(start, end)]}, topic, self.columns)
            if fresh.num_rows:
                self._write_at(pdir / file_name(epoch, start, end, self.suffix), fresh)

    def _write_file(self, key: CoverageKey, start: int, end: int, table: pa.Table) -> None:
        topic, partition, epoch = key
        final = self.partition_dir(topic, partition) / file_name(epoch, start, end, self.suffix)
        self._write_at(final, table)

    def _write_at(self, final: Path, table: pa.Table) -> None:
        write_file_durably(final, lambda tmp: self._write_table(tmp, table))

    def _write_table(self, path: Path, table: pa.Table) -> None:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
