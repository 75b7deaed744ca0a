"""The in-memory tail of each partition: fetched batches that are not yet durable.

The engine appends every fetched batch here and drops it once its segment is durable;
Flight ``follow`` readers serve positions below the durable end from Parquet and
positions above it from here. Because an entry leaves only after it is durable, every
position is always in one place or the other: no gap and no duplicate at the seam.

It holds references to the same batches the writer buffers, so it costs no memory of
its own. Thread-safe: the engine writes from the event loop, Flight reads from its
gRPC threads.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field, replace

import pyarrow as pa


@dataclass(frozen=True, slots=True)
class LiveEntry:
    """One fetched batch of one partition.

    ``covers_from`` is where the tail stood before the batch (its first position, or
    below it where the broker skipped offsets): the tail sets it on ``append``. A
    reader at a position below it must not take the entry — the positions between are
    not in this tail (another member ingested them) and are read from the lane.
    """

    first: int
    last: int
    raw: pa.RecordBatch
    decoded: pa.Table | None
    covers_from: int | None = None


@dataclass(slots=True)
class _Partition:
    entries: deque[LiveEntry] = field(default_factory=deque)
    durable_end: int | None = None
    high_water: int | None = None
    committed: int | None = None


@dataclass(frozen=True, slots=True)
class PartitionState:
    """A consistent snapshot of one partition's positions."""

    durable_end: int | None  # exclusive end of the durable lane
    high_water: int | None  # next position the gateway will ingest
    committed: int | None = None  # what the group has committed


class LiveTail:
    """Per-partition live tails with a condition readers can wait on."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._parts: dict[tuple[str, int], _Partition] = {}
        # Partitions this gateway stopped ingesting: a write finishing late (a flush of
        # a revoked partition) must not bring back a stale state for them.
        self._gone: set[tuple[str, int]] = set()
        self._version = 0

    def reset(self, topic: str, partition: int, position: int | None) -> None:
        """(Re)start a partition at ``position`` (an assignment or a seek)."""
        with self._cond:
            self._parts[(topic, partition)] = _Partition(durable_end=position, high_water=position)
            self._gone.discard((topic, partition))
            self._bump()

    def forget(self, topic: str, partition: int) -> None:
        """This gateway no longer ingests the partition (revoked): its positions are the
        lane's (and, for another owner's live edge, that owner's), not this tail's."""
        with self._cond:
            self._parts.pop((topic, partition), None)
            self._gone.add((topic, partition))
            self._bump()

    def append(self, topic: str, partition: int, entry: LiveEntry) -> None:
        with self._cond:
            if (topic, partition) in self._gone:
                return
            part = self._parts.setdefault((topic, partition), _Partition())
            before = part.high_water
            start = entry.first if before is None else min(before, entry.first)
            part.entries.append(replace(entry, covers_from=start))
            part.high_water = entry.last + 1
            self._bump()

    def mark_durable(self, topic: str, partition: int, end: int) -> None:
        """Everything below ``end`` is now in the Parquet lane: drop it from memory."""
        with self._cond:
            if (topic, partition) in self._gone:
                return
            part = self._parts.setdefault((topic, partition), _Partition())
            part.durable_end = end
            while part.entries and part.entries[0].last < end:
                part.entries.popleft()
            self._bump()

    def mark_committed(self, topic: str, partition: int, offset: int) -> None:
        with self._cond:
            if (topic, partition) in self._gone:
                return
            self._parts.setdefault((topic, partition), _Partition()).committed = offset

    def state(self, topic: str, partition: int) -> PartitionState | None:
        with self._cond:
            part = self._parts.get((topic, partition))
            if part is None:
                return None
            return PartitionState(part.durable_end, part.high_water, part.committed)

    def entries(self, topic: str, partition: int) -> list[LiveEntry]:
        """Every entry the tail holds, oldest first (a reader that joins them to the
        lane's files by position itself: Flight SQL)."""
        with self._cond:
            part = self._parts.get((topic, partition))
            return list(part.entries) if part is not None else []

    def entries_from(self, topic: str, partition: int, position: int) -> list[LiveEntry]:
        """Entries holding positions ``>= position``, oldest first; none when the
        oldest of them starts past ``position`` (a hole this tail cannot fill: the
        reader waits for the lane to hold those positions)."""
        with self._cond:
            part = self._parts.get((topic, partition))
            if part is None:
                return []
            # From the newest back: a follow reader is near the end of the tail, and the
            # tail holds a segment's worth of fetches (hundreds with a long roll age).
            found = []
            for entry in reversed(part.entries):
                if entry.last < position:
                    break
                found.append(entry)
            found.reverse()
            if found:
                start = found[0].covers_from
                if (found[0].first if start is None else start) > position:
                    return []
            return found

    def nbytes(self) -> int:
        """Arrow bytes held by all live entries (what the tail costs in memory)."""
        with self._cond:
            return sum(
                e.raw.nbytes + (e.decoded.nbytes if e.decoded is not None else 0)
                for part in self._parts.values()
                for e in part.entries
            )

    def partitions(self, topic: str) -> list[int]:
        with self._cond:
            return sorted(p for t, p in self._parts if t == topic)

    def topics(self) -> list[str]:
        with self._cond:
            return sorted({t for t, _ in self._parts})

    def version(self) -> int:
        with self._cond:
            return self._version

    def wait(self, seen_version: int, timeout: float) -> int:
        """Block until something changes after ``seen_version`` or ``timeout`` passes."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen_version, timeout)
            return self._version

    def _bump(self) -> None:
        self._version += 1
        self._cond.notify_all()
