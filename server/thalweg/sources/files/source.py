"""A bounded source: the files named for one ``twg batch`` run, as raw-lane batches.

It speaks the :class:`~thalweg.sources.base.Source` protocol, so the run is the stream's
own engine — partitions, checkpoint, decoders, dead-letter lane — with files in place of
a broker: a file is a partition of the lane topic, its row numbers are positions, and
the broker's committed offset is the manifest's ``committed`` (``manifest.py``), written
only after the raw segment holding those rows is durable. Files are read one at a
time, in the order named (a directory or glob: sorted by path). A file that cannot be
read on is marked failed with its reason; the run goes on to the next one.

Its length: the source's whole life — picking files, the manifest, read-ahead, resume
after a crash — is one state machine over one manifest; the formats are apart
(the ``formats`` package, one module per format).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob as pyglob
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from thalweg.config.models import FilesSourceConfig, TypedSourceConfig
from thalweg.errors import ConfigError, InvariantError, SourceError
from thalweg.group.owners import OwnerDirectory
from thalweg.ops.retry import Backoff
from thalweg.records.columns import MetadataColumns
from thalweg.records.file_rows import file_rows_batch
from thalweg.sources.base import PartitionKey, RebalanceCallback, Unbrokered
from thalweg.sources.files.formats import (
    Chunk,
    CsvOptions,
    FileReadError,
    detect,
    read_chunks,
)
from thalweg.sources.files.manifest import UNHASHED, Entry, Identity, Manifest, content_hash
from thalweg.sources.files.readahead import ReadAhead

log = logging.getLogger(__name__)

_GLOB = set("*?[")


@dataclass(frozen=True, slots=True)
class InputFile:
    """A file named for the run: where it is and what it looks like now."""

    fs: pafs.FileSystem
    path: str
    uri: str
    size: int
    mtime_ns: int


def resolve_inputs(specs: list[str]) -> list[InputFile]:
    """Files named by paths, directories (every file below with a known format) and
    globs, local or any URI pyarrow.fs opens (``s3://bucket/prefix/*.parquet``).

    Raises:
        ConfigError: a name matches no file.
    """
    out: list[InputFile] = []
    for spec in specs:
        try:
            found = _expand(spec)
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(f"{spec}: {exc}") from exc
        if not found:
            raise ConfigError(f"{spec}: no such file (nothing matches)")
        out.extend(found)
    seen: set[str] = set()
    return [f for f in out if not (f.uri in seen or seen.add(f.uri))]  # type: ignore[func-returns-value]


def _expand(spec: str) -> list[InputFile]:
    if "://" in spec:
        scheme = spec.split("://", 1)[0]
        glob_at = min((spec.find(c) for c in _GLOB if c in spec), default=-1)
        # A URI cannot hold glob characters: open the directory above them.
        base = spec if glob_at < 0 else spec[: spec.rfind("/", 0, glob_at)]
        fs, root = pafs.FileSystem.from_uri(base)
        path = root if glob_at < 0 else root.rstrip("/") + spec[len(base) :]
        return _from_fs(fs, path, lambda p: f"{scheme}://{p}")
    fs = pafs.LocalFileSystem()
    if _GLOB & set(spec):
        paths = sorted(pyglob.glob(spec, recursive=True))
        return [f for p in paths for f in _from_fs(fs, str(Path(p).resolve()), _file_uri)]
    return _from_fs(fs, str(Path(spec).resolve()), _file_uri)


def _file_uri(path: str) -> str:
    return Path(path).as_uri()


def _from_fs(fs: pafs.FileSystem, path: str, uri: object) -> list[InputFile]:
    make = uri if callable(uri) else _file_uri
    pattern = None
    if _GLOB & set(path):  # a glob in a URI: list its directory, match the names
        pattern, path = (
            path,
            path[: min(path.find(c) for c in _GLOB if c in path)].rsplit("/", 1)[0],
        )
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return []
    if info.type == pafs.FileType.File and pattern is None:
        return [InputFile(fs, path, make(path), info.size, info.mtime_ns or 0)]
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    files = [
        i
        for i in infos
        if i.type == pafs.FileType.File
        and (fnmatch(i.path, pattern) if pattern else detect(i.path) is not None)
    ]
    return [
        InputFile(fs, i.path, make(i.path), i.size, i.mtime_ns or 0)
        for i in sorted(files, key=lambda i: i.path)
    ]


def csv_options(cfg: FilesSourceConfig) -> CsvOptions:
    """How the source's CSV files are split and which cells are null."""
    nulls = None if cfg.csv_null_values is None else tuple(cfg.csv_null_values)
    return CsvOptions(cfg.csv_delimiter, cfg.csv_header, cfg.csv_quote, nulls)


def chunk_batch(
    chunk: Chunk,
    f: InputFile,
    topic: str,
    partition: int,
    cfg: TypedSourceConfig,
    columns: MetadataColumns,
) -> pa.RecordBatch:
    """The raw-lane batch (payload column included) of one chunk of file ``f``."""
    return file_rows_batch(
        table=chunk.table,
        rows=chunk.rows,
        broken=chunk.broken,
        topic=topic,
        partition=partition,
        uri=f.uri,
        mtime_ms=f.mtime_ns // 1_000_000,
        cluster=cfg.cluster_name,
        ingest_ts_us=time.time_ns() // 1000,
        columns=columns,
    )


@dataclass(slots=True)
class Progress:
    """What the run has done so far (read by the progress display and the summary)."""

    files_total: int = 0
    files_done: int = 0
    files_skipped: int = 0
    files_failed: int = 0
    rows: int = 0
    broken_rows: int = 0
    bytes_read: int = 0
    bytes_total: int = 0
    errors: list[dict[str, str]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)


class FileSource(Unbrokered):
    """The files of one run as a :class:`~thalweg.sources.base.Source`."""

    positions_are_offsets = False

    def __init__(
        self, cfg: TypedSourceConfig, columns: MetadataColumns, owners: OwnerDirectory
    ) -> None:
        del owners  # files are read by the one process that was asked to
        self.cfg = cfg
        self.topic = cfg.topics[0]
        self._columns = columns
        if cfg.state_dir is None:
            raise ConfigError(f"sources.{cfg.name}: files are read by twg batch (no state_dir)")
        self.manifest = Manifest.load(cfg.state_dir, self.topic)
        self.progress = Progress()
        self._queue: list[Entry] = []
        self._inputs: dict[int, InputFile] = {}
        self._start: dict[int, int] = {}
        self._current: tuple[Entry, Iterator[Chunk]] | None = None
        self._leftover: pa.RecordBatch | None = None
        self._paused: set[int] = set()
        self._ended: list[PartitionKey] = []
        self._lock: int | None = None
        self._next_row = 0
        # SHA-256 of new files, computed one after another beside the reading (see
        # _admit); a partition's rows are handed on only once its hash is saved.
        self._hashing: dict[int, asyncio.Future[str]] = {}
        self._hasher: asyncio.Task[None] | None = None
        self.finished = asyncio.Event()
        self.lane_partitions: list[int] = []

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, on_assigned: RebalanceCallback, on_revoked: RebalanceCallback) -> None:
        del on_revoked  # nothing takes files away
        if self.cfg.state_dir is None:
            raise InvariantError("self.cfg.state_dir is not set")
        self._lock = Manifest.lock(self.cfg.state_dir, self.topic)
        inputs = await asyncio.to_thread(self._inputs_now)
        self.progress.files_total = len(inputs)
        keys = await self._admit(inputs)
        if keys:
            await on_assigned(keys)
        elif not self.watching:
            self.finished.set()

    # What a subclass reading a directory as it fills changes (sources/files/directory.py).
    watching = False

    def _inputs_now(self) -> list[InputFile]:
        if not isinstance(self.cfg, FilesSourceConfig):
            raise InvariantError("self.cfg is not a FilesSourceConfig")
        return resolve_inputs(self.cfg.paths)

    def _format_of(self, f: InputFile) -> str | None:
        if not isinstance(self.cfg, FilesSourceConfig):
            raise InvariantError("self.cfg is not a FilesSourceConfig")
        return self.cfg.file_format if self.cfg.file_format != "auto" else detect(f.path)

    def _csv_options(self) -> CsvOptions:
        if isinstance(self.cfg, FilesSourceConfig):
            return csv_options(self.cfg)
        return CsvOptions()

    async def _admit(self, inputs: list[InputFile]) -> list[PartitionKey]:
        """Queue the files not yet durable (known by identity: done ones are skipped),
        each with its partition; the keys to announce.

        A file the manifest knows by URI, size and modification time is hashed here, to
        tell it from one rewritten in place. A new file is hashed beside the reading
        instead (the run's first file no longer waits for every file's hash: 0.15 s of
        five 26 MB files, with nothing else running), before any of its rows is handed
        on (``_hash_saved``): no segment of its partition is ever durable while the
        manifest lacks its identity.
        """
        p = self.progress
        queued: list[PartitionKey] = []
        fresh: list[tuple[Entry, InputFile]] = []
        for f in inputs:
            fmt = self._format_of(f)
            if fmt is None:
                self._fail_early(f, "unknown format: name a known suffix or set file_format")
                continue
            entry = None
            if self.manifest.known(f.uri, f.size, f.mtime_ns):
                try:
                    digest = await asyncio.to_thread(content_hash, f.fs, f.path)
                except OSError as exc:
                    self._fail_early(f, f"cannot be read: {exc}")
                    continue
                identity = Identity(f.uri, f.size, f.mtime_ns, digest)
                entry = self.manifest.find(identity)
                if entry is None:
                    entry = self.manifest.add(identity, fmt, self.lane_partitions)
            else:
                entry = self.manifest.add(
                    Identity(f.uri, f.size, f.mtime_ns, UNHASHED), fmt, self.lane_partitions
                )
                fresh.append((entry, f))
            if entry.state == "done":
                p.files_skipped += 1
                continue
            entry.state, entry.error = "pending", None
            self._queue.append(entry)
            self._inputs[entry.partition] = f
            p.bytes_total += f.size
            queued.append((self.topic, entry.partition))
        if fresh:
            loop = asyncio.get_running_loop()
            futures = [(e, f, loop.create_future()) for e, f in fresh]
            self._hashing.update((e.partition, fut) for e, _, fut in futures)
            previous = self._hasher
            self._hasher = asyncio.create_task(self._hash_all(previous, futures))
        await self._save_waiting()
        return queued

    async def _hash_all(
        self,
        previous: asyncio.Task[None] | None,
        files: list[tuple[Entry, InputFile, asyncio.Future[str]]],
    ) -> None:
        """Hash new files in order, one at a time (after an earlier admission's)."""
        if previous is not None:
            await asyncio.shield(previous)
        for _, f, fut in files:
            try:
                fut.set_result(await asyncio.to_thread(content_hash, f.fs, f.path))
            except Exception as exc:  # OSError, or what a remote file system raises
                fut.set_exception(exc)

    async def _hash_saved(self, entry: Entry) -> bool:
        """Wait for a new file's hash and save it in the manifest; False when the file
        cannot be read (it is marked failed and its reading stops)."""
        fut = self._hashing.pop(entry.partition, None)
        if fut is None:
            return True
        try:
            entry.sha256 = await fut
        except Exception as exc:
            if entry.state == "failed":  # its reading failed first, and said so
                return False
            why = f"{entry.uri}: cannot be read: {exc}"
            entry.rows = entry.rows or 0
            entry.state, entry.error = "failed", why
            self.progress.files_failed += 1
            self.progress.errors.append({"file": entry.uri, "error": why})
            log.error("%s; skipped", why)
            if self._current is not None and self._current[0] is entry:
                self._close_current()
                self._ended.append((self.topic, entry.partition))
            return False
        await self._save_waiting()
        return True

    async def _save_waiting(self) -> None:
        """Save the manifest, waiting (retried with backoff) while the disk refuses it.

        Unlike a commit, which the next segment's commit covers, these saves guard an
        order: a file's identity and hash are on disk before any of its rows is handed
        on, and the ends of files are recorded at the end. So a full disk makes the run
        wait here, as a segment write waits, rather than fail it; it goes on once space
        is freed.
        """
        backoff = Backoff(base_s=0.1, cap_s=5.0)
        while True:
            try:
                await asyncio.to_thread(self.manifest.save)
                return
            except OSError as exc:
                delay = backoff.next_delay()
                log.warning(
                    "batch manifest %s not saved: %s; retried in %.1fs",
                    self.manifest.path,
                    exc,
                    delay,
                )
            await asyncio.sleep(delay)

    def _fail_early(self, f: InputFile, why: str) -> None:
        self.progress.files_failed += 1
        self.progress.errors.append({"file": f.uri, "error": why})
        log.error("%s: %s; skipped", f.uri, why)

    async def stop(self) -> None:
        self._close_current()
        if self._hasher is not None:
            self._hasher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._hasher
        if self._lock is not None:
            os.close(self._lock)  # releases the run's lock
            self._lock = None

    # -- reading ---------------------------------------------------------------------

    def _close_current(self) -> None:
        if self._current is not None:
            chunks = self._current[1]
            if isinstance(chunks, ReadAhead):
                chunks.close()
        self._current = None

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[PartitionKey, pa.RecordBatch]:
        batch = self._leftover
        if batch is not None and self._partition_of(batch) in self._paused:
            await asyncio.sleep(min(timeout_ms, 50) / 1000)
            return {}
        self._leftover = None
        while batch is None:
            if self._current is None and not self._open_next():
                await asyncio.sleep(timeout_ms / 1000)
                return {}
            if self._current is None:
                raise InvariantError("self._current is not set")
            entry, chunks = self._current
            if entry.partition in self._paused:
                await asyncio.sleep(min(timeout_ms, 50) / 1000)
                return {}
            chunk = await asyncio.to_thread(self._next_chunk, entry, chunks)
            if chunk is None:  # ended: an empty file had no row to wait for its hash
                await self._hash_saved(entry)
            elif chunk.num_rows and await self._hash_saved(entry):
                batch = await asyncio.to_thread(self._batch, entry, chunk)
        key = (self.topic, self._partition_of(batch))
        if batch.num_rows > max_records:
            self._leftover = batch.slice(max_records)
            batch = batch.slice(0, max_records)
        return {key: batch}

    def _partition_of(self, batch: pa.RecordBatch) -> int:
        return int(batch.column(self._columns.partition)[0].as_py())

    def _open_next(self) -> bool:
        """Start reading the next file; False when every file has been read."""
        while self._queue:
            entry = self._queue.pop(0)
            start = self._start.get(entry.partition, entry.committed)
            f = self._inputs[entry.partition]
            opts = self._csv_options()
            chunks = read_chunks(f.fs, f.path, entry.format, start, opts)
            self._current = (entry, ReadAhead(chunks))
            self._next_row = start
            return True
        self._current = None
        if not self.watching and not self.finished.is_set():
            self.finished.set()
        return False

    def _next_chunk(self, entry: Entry, chunks: Iterator[Chunk]) -> Chunk | None:
        """The file's next chunk; None when it ended (read to its end, or failed)."""
        try:
            chunk = next(chunks)
        except StopIteration:
            entry.rows = self._next_row
            self.progress.files_done += 1
            self._current = None
            self._ended.append((self.topic, entry.partition))
            return None
        except FileReadError as exc:
            entry.rows = self._next_row
            entry.state, entry.error = "failed", str(exc)
            self.progress.files_failed += 1
            self.progress.errors.append({"file": entry.uri, "error": str(exc)})
            log.error("%s; skipped from row %d on", exc, self._next_row)
            self._current = None
            self._ended.append((self.topic, entry.partition))
            return None
        if chunk.num_rows:
            last = int(chunk.rows[-1]) if len(chunk.rows) else -1
            self._next_row = max(last, max((b.row for b in chunk.broken), default=-1)) + 1
        self.progress.rows += chunk.num_rows
        self.progress.broken_rows += len(chunk.broken)
        self.progress.bytes_read += chunk.nbytes
        return chunk

    def _batch(self, entry: Entry, chunk: Chunk) -> pa.RecordBatch:
        f = self._inputs[entry.partition]
        return chunk_batch(chunk, f, self.topic, entry.partition, self.cfg, self._columns)

    # -- positions -------------------------------------------------------------------

    async def commit(self, positions: dict[PartitionKey, int]) -> None:
        """Record rows below ``positions`` as durable; a file read to its end and
        durable to its last row is done (a later run skips it)."""
        for (_, partition), position in positions.items():
            entry = self.manifest.by_partition(partition)
            entry.committed = max(entry.committed, position)
            if entry.rows is not None and entry.committed >= entry.rows and entry.state != "failed":
                entry.state = "done"
        try:
            await asyncio.to_thread(self.manifest.save)
        except OSError as exc:
            # A full disk, say: as a broker's refused commit, the next segment's commit
            # covers this one, and a restart resumes at the lane's end anyway.
            raise SourceError(f"batch manifest {self.manifest.path} not saved: {exc}") from exc

    async def settle(self) -> None:
        """After the last commit: files that ended with nothing left to make durable
        (empty files, or every row already durable) are done too."""
        for entry in self.manifest.entries:
            if entry.partition in self._hashing:  # a file no row of which was handed on
                await self._hash_saved(entry)
            ended = entry.rows is not None and entry.committed >= entry.rows
            if entry.partition in self._inputs and entry.state == "pending" and ended:
                entry.state = "done"
        await self._save_waiting()

    async def committed(self, key: PartitionKey) -> int | None:
        entry = self.manifest.by_partition(key[1])
        return entry.committed or None

    def seek(self, key: PartitionKey, position: int) -> None:
        """Read ``key``'s file from ``position``: at its start, or again from there when
        it is being read (what was read beyond it and not durable is read again)."""
        self._start[key[1]] = position
        if self._current is not None and self._current[0].partition == key[1]:
            entry, chunks = self._current
            if isinstance(chunks, ReadAhead):
                chunks.close()
            f = self._inputs[entry.partition]
            opts = self._csv_options()
            reread = read_chunks(f.fs, f.path, entry.format, position, opts)
            self._current = (entry, ReadAhead(reread))
            self._next_row = position
            self._leftover = None

    def ended(self) -> list[PartitionKey]:
        out, self._ended = self._ended, []
        return out

    def highwater(self, key: PartitionKey) -> int | None:
        return self.manifest.by_partition(key[1]).rows

    def pause(self, keys: list[PartitionKey]) -> None:
        self._paused.update(p for _, p in keys)

    def resume(self, keys: list[PartitionKey]) -> None:
        self._paused.difference_update(p for _, p in keys)
