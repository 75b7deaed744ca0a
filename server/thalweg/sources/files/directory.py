"""Arrow IPC files dropped into a directory, read by ``twg stream`` as they appear.

The batch source's machinery, unbounded: every ``poll_interval_s`` the directory is
listed, and each new file matching ``pattern`` whose size and modification time have
held still for ``settle_s`` becomes a new partition of the lane topic (announced to the
runner like a broker assignment), read from its first row — or, after a restart, from
its last durable row: the manifest commits each file's rows after the raw segment
holding them is durable, exactly as ``twg batch`` does. A file is known by its identity
(URI, size, modification time, SHA-256), so a file that changes after it was read is a
new file: write drops under a temporary name and rename them into place.
"""

from __future__ import annotations

import asyncio
import time
from fnmatch import fnmatch
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from thalweg.config.models import ArrowIpcSourceConfig
from thalweg.group.owners import OwnerDirectory
from thalweg.records.columns import MetadataColumns
from thalweg.sources.base import PartitionKey, RebalanceCallback
from thalweg.sources.files.source import FileSource, InputFile, _file_uri


class DirectorySource(FileSource):
    """An ``arrow_ipc`` source (see the module docstring)."""

    watching = True

    def __init__(
        self, cfg: ArrowIpcSourceConfig, columns: MetadataColumns, owners: OwnerDirectory
    ) -> None:
        super().__init__(cfg, columns, owners)
        self.dir_cfg = cfg
        self._scheme: str | None = None
        if "://" in cfg.directory:
            self._fs, self._root = pafs.FileSystem.from_uri(cfg.directory)
            self._scheme = cfg.directory.split("://", 1)[0]
        else:
            self._fs, self._root = pafs.LocalFileSystem(), str(Path(cfg.directory).resolve())
        # Files seen at (size, mtime): one not yet settled, or already admitted.
        self._sizes: dict[str, tuple[int, int, float]] = {}
        self._admitted: set[tuple[str, int, int]] = set()
        self._on_assigned: RebalanceCallback | None = None
        self._next_scan = 0.0

    async def start(self, on_assigned: RebalanceCallback, on_revoked: RebalanceCallback) -> None:
        self._on_assigned = on_assigned
        await super().start(on_assigned, on_revoked)

    def _format_of(self, f: InputFile) -> str | None:
        return "arrow"

    def _inputs_now(self) -> list[InputFile]:
        """Files matching the pattern that held still for ``settle_s`` and were not
        admitted before, by path order."""
        now = time.monotonic()
        selector = pafs.FileSelector(self._root, recursive=False, allow_not_found=True)
        ready: list[InputFile] = []
        for info in sorted(self._fs.get_file_info(selector), key=lambda i: i.path):
            if info.type != pafs.FileType.File or not fnmatch(info.base_name, self.dir_cfg.pattern):
                continue
            if info.base_name.startswith("."):
                continue  # a writer's temp file
            size, mtime = info.size or 0, info.mtime_ns or 0
            if (info.path, size, mtime) in self._admitted:
                continue
            seen = self._sizes.get(info.path)
            if seen is None or seen[:2] != (size, mtime):
                self._sizes[info.path] = (size, mtime, now)
                if self.dir_cfg.settle_s > 0:
                    continue
            elif now - seen[2] < self.dir_cfg.settle_s:
                continue
            self._admitted.add((info.path, size, mtime))
            ready.append(InputFile(self._fs, info.path, self._uri(info.path), size, mtime))
        return ready

    def _uri(self, path: str) -> str:
        return f"{self._scheme}://{path}" if self._scheme else _file_uri(path)

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[PartitionKey, pa.RecordBatch]:
        if self._current is None and not self._queue and self._leftover is None:
            now = time.monotonic()
            if now >= self._next_scan:
                self._next_scan = now + self.dir_cfg.poll_interval_s
                await self._scan()
        return await super().fetch(timeout_ms, max_records)

    async def _scan(self) -> None:
        inputs = await asyncio.to_thread(self._inputs_now)
        if not inputs:
            return
        self.progress.files_total += len(inputs)
        keys = await self._admit(inputs)
        if keys and self._on_assigned is not None:
            await self._on_assigned(keys)
