"""Arrow IPC copies of recent decoded segments, memory-mapped by cold reads.

Serving history that is not in the memory cache (``lane.cache``) costs Parquet
decoding: zstd and page decoding held a cold ``do_get`` to 0.37-0.52x a bare in-memory
Flight server on two cores, whatever the decoded lane's codec (docs/performance.md).
So when a decoded segment is written, the writer also writes its table uncompressed as
an Arrow IPC file under ``<lane root>/ipc/`` (the same relative path, ``.arrow``); a read
that misses the memory cache maps that file and gets the table without decoding or
copying — the pages come from the OS page cache, and gRPC sends them from there.

The copies are a cache, never the lane: the Parquet segment stays the durable record,
written (and fsynced) first. A copy is written to a temp name and renamed, not fsynced;
one that is missing, torn or unreadable is removed and the read decodes the Parquet
file. Disk use is bounded by ``gateway.flight.ipc_copy_bytes``, oldest copies out first
(the budget is re-counted from the directory at start-up), and a copy whose segment
retention or compaction removed is deleted with it (``remove_copy``), and any left is
dropped at the next write. Thread-safe.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

import pyarrow as pa

from thalweg.lane.durable import temp_path

log = logging.getLogger(__name__)

IPC_DIR = "ipc"
SUFFIX = ".arrow"
_TMP = ".tmp-"


def copy_of(root: Path, segment: Path) -> Path | None:
    """Where the copy of ``segment`` (a file under the lane root ``root``) lives."""
    try:
        rel = segment.relative_to(root)
    except ValueError:
        return None
    return root / IPC_DIR / rel.with_suffix(SUFFIX)


def remove_copy(root: Path, segment: Path) -> None:
    """Delete the copy of a segment being deleted (retention, compaction) at once: on a
    full disk the next write, which would drop it too, may never come — the copy's
    space is what it needs."""
    target = copy_of(root, segment)
    if target is not None:
        target.unlink(missing_ok=True)


class IpcCopies:
    """Byte-bounded Arrow IPC copies of decoded segments under ``root / ipc``."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.dir = root / IPC_DIR
        self.max_bytes = max_bytes
        self._files: OrderedDict[Path, int] = OrderedDict()  # copy → bytes, oldest first
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        if max_bytes > 0:
            self._recount()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def copy_path(self, segment: Path) -> Path | None:
        """Where the copy of ``segment`` (a file under the lane root) lives."""
        return copy_of(self.root, segment)

    def put(self, segment: Path, table: pa.Table) -> None:
        """Write ``table`` as the copy of ``segment``; a table larger than a quarter of
        the budget is not copied (one segment must not push out all the others)."""
        size = table.get_total_buffer_size()
        target = self.copy_path(segment)
        if not self.enabled or target is None or size > self.max_bytes // 4:
            return
        tmp = temp_path(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
                w.write_table(table)
            os.replace(tmp, target)
            written = target.stat().st_size
        except (OSError, pa.ArrowException) as exc:  # only a cache: reads decode Parquet
            tmp.unlink(missing_ok=True)
            log.debug("no IPC copy of %s: %s", segment, exc)
            return
        with self._lock:
            old = self._files.pop(target, None)
            self._bytes += written - (old or 0)
            self._files[target] = written
            evict = self._orphans()
            while self._bytes > self.max_bytes and self._files:
                path, n = self._files.popitem(last=False)
                self._bytes -= n
                evict.append(path)
        for path in evict:
            path.unlink(missing_ok=True)

    def get(self, segment: Path) -> pa.Table | None:
        """The copy of ``segment``, memory-mapped (zero-copy), or None."""
        target = self.copy_path(segment)
        if not self.enabled or target is None:
            return None
        try:
            source = pa.memory_map(str(target))
        except FileNotFoundError:
            return None
        except OSError:
            return None
        try:
            table = pa.ipc.open_file(source).read_all()
        except (OSError, pa.ArrowException) as exc:
            log.warning("IPC copy %s unreadable (%s): removed; reading the segment", target, exc)
            self.discard(segment)
            return None
        with self._lock:
            self.hits += 1
        return table

    def discard(self, segment: Path) -> None:
        """Remove the copy of ``segment`` (retention or compaction removed the segment)."""
        target = self.copy_path(segment)
        if target is None:
            return
        with self._lock:
            n = self._files.pop(target, None)
            if n is not None:
                self._bytes -= n
        target.unlink(missing_ok=True)

    def clear(self) -> int:
        """Delete every copy (the disk is full: a cache never holds space the lanes
        need); the bytes freed. Reads decode the Parquet segments until copies are
        written again."""
        with self._lock:
            files = list(self._files)
            freed = self._bytes
            self._files.clear()
            self._bytes = 0
        for path in files:
            path.unlink(missing_ok=True)
        if files:
            log.warning(
                "disk full: %d IPC copies removed (%d bytes) to make room", len(files), freed
            )
        return freed

    def segment_of(self, copy: Path) -> Path:
        """The decoded segment a copy was made of."""
        return self.root / copy.relative_to(self.dir).with_suffix(".parquet")

    def _orphans(self) -> list[Path]:
        """Copies whose segment is gone (retention or compaction removed it), taken out
        of the count — called under the lock, each write: a stat per copy kept, by plain
        strings (pathlib's joins cost ten times the stat, and a roll of many partitions
        writes many copies at once)."""
        copies, root, cut = str(self.dir), str(self.root), len(SUFFIX)
        gone = [
            c
            for c in self._files
            if not os.path.exists(root + str(c)[len(copies) : -cut] + ".parquet")
        ]
        for c in gone:
            self._bytes -= self._files.pop(c)
        return gone

    def _recount(self) -> None:
        """Count the copies on disk, oldest first; drop temp files a crash left."""
        found: list[tuple[float, Path, int]] = []
        for dirpath, _dirs, names in os.walk(self.dir):
            for name in names:
                path = Path(dirpath) / name
                if _TMP in name:
                    path.unlink(missing_ok=True)
                    continue
                if name.endswith(SUFFIX):
                    st = path.stat()
                    found.append((st.st_mtime, path, st.st_size))
        for _mtime, path, size in sorted(found):
            self._files[path] = size
            self._bytes += size
        for path in self._orphans():
            path.unlink(missing_ok=True)
