"""Recent segments kept in memory as Arrow, so hot reads skip Parquet decoding.

Serving history from disk costs Parquet decoding — about half of a ``do_get``'s time on
two cores (docs/performance.md). Readers mostly want what was just written, so the
segment writer puts each segment's tables here as it renames them (write-through), and a
full read of a segment that is not here puts it here (read-through). Segments are
immutable once renamed, so an entry never goes stale. Memory is bounded by
``gateway.flight.segment_cache_bytes``, least recently used out first; ``0`` turns it
off. The tables are the ones the writer already built: caching one costs a reference,
not a copy.

Behind it, optionally, Arrow IPC copies of the decoded segments on disk
(``lane.ipc_copies``): a miss here is answered from a memory-mapped copy when there is
one, so a cold read does not decode Parquet either.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

import pyarrow as pa

from thalweg.lane.read.ipc_copies import IpcCopies


class SegmentCache:
    """A byte-bounded LRU of whole segment tables, keyed by file path. Thread-safe."""

    def __init__(self, max_bytes: int, copies: IpcCopies | None = None) -> None:
        self.max_bytes = max_bytes
        self.copies = copies
        self._tables: OrderedDict[Path, tuple[pa.Table, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0 or (self.copies is not None and self.copies.enabled)

    @property
    def nbytes(self) -> int:
        """Bytes held: whole buffers referenced, not just the rows in view."""
        return self._bytes

    def get(self, path: Path) -> pa.Table | None:
        """The table of ``path`` from memory, else from its IPC copy, else None."""
        with self._lock:
            found = self._tables.get(path)
            if found is not None:
                self._tables.move_to_end(path)
                self.hits += 1
                return found[0]
            self.misses += 1
        return self.copies.get(path) if self.copies is not None else None

    def put(self, path: Path, table: pa.Table, *, copy: bool = False) -> None:
        """Keep ``table`` as the content of ``path``; a table larger than a quarter of
        the bound is not kept (one segment must not flush everything else). With
        ``copy`` (the writer, for a decoded segment) it is also written as an IPC copy."""
        if copy and self.copies is not None:
            self.copies.put(path, table)
        size = table.get_total_buffer_size()
        if self.max_bytes <= 0 or size > self.max_bytes // 4:
            return
        with self._lock:
            old = self._tables.pop(path, None)
            if old is not None:
                self._bytes -= old[1]
            self._tables[path] = (table, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._tables.popitem(last=False)
                self._bytes -= evicted

    def discard(self, path: Path) -> None:
        """Forget ``path`` (a segment removed by repair or rewritten)."""
        with self._lock:
            old = self._tables.pop(path, None)
            if old is not None:
                self._bytes -= old[1]
        if self.copies is not None:
            self.copies.discard(path)
