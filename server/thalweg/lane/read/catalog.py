"""What the gateway can serve: topics, partitions, positions and schemas.

Merges three views: the Parquet lanes on disk (everything durable, including topics no
longer consumed), the live tail (positions of partitions being ingested), and the
engine's decoders (the current decoded schema of each topic).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from thalweg.lane.coverage import scan_coverage
from thalweg.lane.epochs import closed_epochs, current_epoch, epoch_layout
from thalweg.lane.layout import Lane, LaneLayout, Segment
from thalweg.lane.read.cache import SegmentCache
from thalweg.lane.read.elsewhere import first_gap
from thalweg.lane.read.live import LiveEntry, LiveTail
from thalweg.lane.read.reader import LaneReader
from thalweg.records.columns import MetadataColumns

_DISK_TTL_S = 1.0
_STATS_CACHE_MAX = 200_000


@dataclass(frozen=True, slots=True)
class Run:
    """How far a history read may go from a position without passing a hole.

    ``gap`` is ``[lo, hi)`` when the position lies in a hole of the lane: after its
    start and before its end, or in a range another replica's ``data_dir`` holds. A
    reader must not step over it as if it were read. ``end`` is the exclusive end of the
    durable run from the position (None: the lane holds nothing there — a position
    below the lane's start reads from its start, as retention and a log's start make
    it).
    """

    end: int | None
    gap: tuple[int, int] | None = None
    held: bool = False  # the gap is another replica's for good (never fills here)


class Ingesting:
    """What the running gateway knows that the lane's files do not yet say — the one
    seam through which the read side hears from the engine. This base answers for a
    lane nobody ingests (a closed epoch, a test, a tool reading a data_dir)."""

    def payload_schema(self, topic: str) -> pa.Schema | None:
        """The topic's current decoded schema (None: take it from the files)."""
        return None

    def decoded_topics(self) -> set[str]:
        """Topics that have a decoded lane, even before its first file."""
        return set()

    def configured_topics(self) -> list[str]:
        """Topics the configuration names, even before their first record."""
        return []

    def configured_sinks(self) -> list[str]:
        """The ``[[sinks]]`` the configuration names, even before one refused a record."""
        return []

    def group_partitions(self, topic: str) -> list[int]:
        """Partitions other members of the consumer group ingest (``group/owners.py``):
        listed so a read is sent to their owner, though nothing of them is local."""
        return []

    def awaiting_assignment(self, topic: str) -> bool:
        """Whether this member's consumer-group assignment for ``topic`` has not arrived
        yet, so a partition it does not know may still be the group's."""
        return False

    def read_through(self, topic: str) -> None:
        """Before a read of ``topic`` is planned: with lanes in an object store, fetch a
        topic this replica has nothing of yet."""


class LaneCatalog:
    """Read-side view of the lanes, safe to use from Flight's threads."""

    def __init__(
        self,
        layout: LaneLayout,
        columns: MetadataColumns,
        live: LiveTail,
        *,
        ingesting: Ingesting | None = None,
        cache: SegmentCache | None = None,
        retention_grace_s: float = 60.0,
    ) -> None:
        self.layout = layout
        self.retention_grace_s = retention_grace_s
        self.columns = columns
        self.live = live
        self.reader = LaneReader(layout, columns, cache)
        self._ingesting = ingesting or Ingesting()
        self._disk_cache: dict[tuple[str, int], tuple[float, int]] = {}
        self._stats_cache: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._epochs: dict[int, LaneCatalog] = {}
        self._cache = cache

    def for_epoch(self, epoch: int) -> LaneCatalog:
        """A read-only view of closed epoch ``epoch`` (docs/lanes.md): its own lane root,
        nothing live, schemas from its files."""
        with self._lock:
            found = self._epochs.get(epoch)
            if found is None:
                found = LaneCatalog(
                    epoch_layout(self.layout, epoch),
                    self.columns,
                    LiveTail(),
                    cache=self._cache,
                    retention_grace_s=self.retention_grace_s,
                )
                self._epochs[epoch] = found
            return found

    def topics(self) -> list[str]:
        return sorted(
            set(self.layout.topics())
            | set(self.live.topics())
            | set(self._ingesting.configured_topics())
        )

    def partitions(self, topic: str) -> list[int]:
        return sorted(
            set(self.layout.partitions(topic))
            | set(self.live.partitions(topic))
            | set(self._ingesting.group_partitions(topic))
        )

    def awaiting_assignment(self, topic: str) -> bool:
        """See :meth:`Ingesting.awaiting_assignment`."""
        return self._ingesting.awaiting_assignment(topic)

    def has_decoded(self, topic: str) -> bool:
        return topic in self._ingesting.decoded_topics() or self.layout.has_decoded(topic)

    def durable_end(self, topic: str, partition: int) -> int:
        """Exclusive end of the partition's durable lane (0 when empty)."""
        state = self.live.state(topic, partition)
        if state is not None and state.durable_end is not None:
            return state.durable_end
        key = (topic, partition)
        now = time.monotonic()
        with self._lock:
            cached = self._disk_cache.get(key)
            if cached and now - cached[0] < _DISK_TTL_S:
                return cached[1]
        end = scan_coverage(self.layout, topic, partition).end or 0
        with self._lock:
            self._disk_cache[key] = (now, end)
        return end

    def run_from(self, topic: str, partition: int, position: int) -> Run:
        """Where the durable run that ``position`` starts in ends (see :class:`Run`).

        A read of history checks this before moving its cursor: the durable end says
        what was written, not that this lane holds every position below it. A member
        that returns to a partition another member ingested meanwhile resumes past this
        lane's end; the positions between are the other member's (``lane/read/elsewhere.py``)
        or, with an object store, arrive with the restore.
        """
        held = first_gap(self.layout, topic, partition, position, position + 1)
        if held is not None:
            return Run(None, held, held=True)
        ranges = scan_coverage(self.layout, topic, partition).ranges
        if not ranges:
            return Run(None)
        if position < ranges[0][0]:
            return Run(ranges[0][1])
        for a, b in ranges:
            if position < a:
                return Run(None, (position, a))
            if position < b:
                return Run(b)
        durable = self.durable_end(topic, partition)
        return Run(None, (position, durable) if position < durable else None)

    def prepare(self, topic: str) -> None:
        """Before a read of ``topic`` is planned: with lanes in an object store, a topic
        this replica has nothing of yet is fetched first (read-through)."""
        self._ingesting.read_through(topic)

    def refresh(self, topic: str, partition: int) -> None:
        """The partition's files changed behind this gateway's back (a replica's sync
        fetched segments): forget what was read of them (the durable end), so the next
        read sees them at once."""
        with self._lock:
            self._disk_cache.pop((topic, partition), None)

    def high_water(self, topic: str, partition: int) -> int:
        """The next position the gateway will ingest (the durable end when not ingesting)."""
        state = self.live.state(topic, partition)
        if state is not None and state.high_water is not None:
            return max(state.high_water, self.durable_end(topic, partition))
        return self.durable_end(topic, partition)

    def payload_schema(self, topic: str) -> pa.Schema:
        """Payload columns of the decoded lane (no metadata columns)."""
        schema = self._ingesting.payload_schema(topic) or self.reader.decoded_schema(topic)
        if schema is None:
            return pa.schema([])
        return pa.schema([f for f in schema if not self.columns.is_reserved(f.name)])

    def describe(self, topic: str) -> dict[str, object]:
        """Per partition: the lane's first position, durable end, committed offset and
        the next position the gateway will ingest."""
        parts = []
        for p in self.partitions(topic):
            cov = scan_coverage(self.layout, topic, p)
            state = self.live.state(topic, p)
            parts.append(
                {
                    "partition": p,
                    "epoch": current_epoch(self.layout, topic, p),
                    "closed_epochs": closed_epochs(self.layout, topic, p),
                    "earliest": cov.ranges[0][0] if cov.ranges else None,
                    "durable": self.durable_end(topic, p),
                    "committed": state.committed if state is not None else None,
                    "latest": self.high_water(topic, p),
                    "durable_rows": self.durable_rows(topic, p),
                }
            )
        return {"topic": topic, "partitions": parts}

    def durable_rows(self, topic: str, partition: int) -> int:
        """Rows in the partition's durable raw lane, from file footers."""
        return sum(
            self.segment_stats(s.path)[0] for s in self.layout.segments(Lane.RAW, topic, partition)
        )

    def records_between(self, topic: str, partition: int, start: int, end: int) -> int:
        """Durable records of ``[start, end)``, from footers: whole segments, so at most
        the rows of the first segment below ``start`` too many."""
        segments = self.reader.segments_between(topic, partition, start, end)
        return sum(self.segment_stats(s.path)[0] for s in segments)

    # -- the questions of a read (flight/read, flight/sql): nothing else of the lane's
    # layout, reader or live tail is reached from there (tests/unit/house/test_layering.py).

    def earliest(self, topic: str, partition: int) -> int:
        """The first position retention keeps (the partition's floor)."""
        return self.layout.floor(topic, partition)

    def still_held(self, topic: str, partition: int, position: int) -> bool:
        """Whether ``position`` can still be read: at or above the floor, or below it
        within ``retention_grace_s`` of the rise that put it there, in a segment still on
        disk (an endpoint planned before the floor rose is answered through the grace).

        Past the grace a position below the floor is refused whatever the disk holds: a
        file can outlive it — an object-store replica keeps a cached file two minutes
        after it left the bucket, a kill -9 may delay a sweep — and answering from it
        would make a read's answer depend on which replica took it and when."""
        floor = self.layout.floor(topic, partition)
        if position >= floor:
            return True
        rose = self.layout.floor_rose_at(topic, partition, position)
        if rose is None or time.time() - rose > self.retention_grace_s:
            return False
        below = [
            s
            for s in self.layout.segments(Lane.RAW, topic, partition, retained=False)
            if s.first < floor and s.last >= position
        ]
        return bool(below) and below[0].first <= position

    def held_elsewhere(
        self, topic: str, partition: int, start: int, end: int | None
    ) -> tuple[int, int] | None:
        """The first range of ``[start, end)`` another replica's ``data_dir`` holds
        (``lane/read/elsewhere.py``), or None."""
        return first_gap(self.layout, topic, partition, start, end)

    def position_at(self, topic: str, partition: int, timestamp_ms: int, end: int) -> int | None:
        """The first durable position below ``end`` at or after ``timestamp_ms``."""
        return self.reader.offset_for_timestamp(topic, partition, timestamp_ms, end)

    def segments(self, lane: Lane, topic: str, partition: int) -> list[Segment]:
        """The partition's retained segments of ``lane``, in position order."""
        return self.layout.segments(lane, topic, partition)

    def segments_between(self, topic: str, partition: int, start: int, end: int) -> list[Segment]:
        """The raw segments holding any of ``[start, end)``."""
        return self.reader.segments_between(topic, partition, start, end)

    def twin(self, lane: Lane, topic: str, partition: int, segment: Segment) -> Path:
        """The path of ``segment``'s twin in ``lane`` (the same name, the same rows)."""
        return self.layout.partition_dir(lane, topic, partition) / segment.path.name

    def dead_letter_sinks(self) -> list[str]:
        """The sinks whose refused records a ``lane = "dlq"`` read may name: those the
        configuration names and those whose dead-letter lane is on disk."""
        return sorted(set(self._ingesting.configured_sinks()) | set(self.layout.refusing_sinks()))

    def dead_letter_segments(self, topic: str, partition: int, sink: str | None) -> list[Segment]:
        """The partition's dead letters: decoding's (``sink`` None), or a sink's own —
        the records it refused (``recovery.refused``), every file, named by what it holds."""
        if sink is None:
            return self.layout.segments(Lane.DLQ, topic, partition, retained=False)
        return self.layout.refused(sink).segments(
            Lane.DLQ, topic, partition, retained=False, contained=True
        )

    def read_pairs(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        *,
        decoded: bool,
        with_raw: bool,
        wanted: set[str] | None = None,
        predicate: pc.Expression | None = None,
    ) -> Iterator[tuple[pa.Table | None, pa.Table | None]]:
        """``(raw, decoded)`` tables of ``[start, end)``, segment by segment
        (:meth:`LaneReader.read_pairs`)."""
        return self.reader.read_pairs(
            topic,
            partition,
            start,
            end,
            decoded=decoded,
            with_raw=with_raw,
            wanted=wanted,
            predicate=predicate,
        )

    def live_version(self) -> int:
        """The live tail's version: it changes whenever an entry is appended."""
        return self.live.version()

    def wait_live(self, seen_version: int, timeout: float) -> int:
        """Block until the live tail's version passes ``seen_version`` or ``timeout``."""
        return self.live.wait(seen_version, timeout)

    def live_from(self, topic: str, partition: int, position: int) -> list[LiveEntry]:
        """The live entries holding ``position`` and after (none when the oldest held
        starts past it: history first)."""
        return self.live.entries_from(topic, partition, position)

    def live_entries(self, topic: str, partition: int) -> list[LiveEntry]:
        """Every live entry of the partition, oldest first."""
        return self.live.entries(topic, partition)

    @property
    def scratch_root(self) -> Path:
        """The lane root, under which a reader may keep scratch files of its own."""
        return self.layout.root

    def segment_stats(self, path: Path) -> tuple[int, int]:
        """``(rows, uncompressed bytes)`` of one segment, from its footer.

        Segments are immutable once renamed into place, so the footer is read once; the
        byte figure is Parquet's uncompressed size, the closest cheap estimate of what
        the rows weigh in Arrow.
        """
        key = str(path)
        with self._lock:
            hit = self._stats_cache.get(key)
        if hit is not None:
            return hit
        meta = pq.read_metadata(path)
        stats = (
            meta.num_rows,
            sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)),
        )
        with self._lock:
            if len(self._stats_cache) >= _STATS_CACHE_MAX:
                self._stats_cache.clear()
            self._stats_cache[key] = stats
        return stats
