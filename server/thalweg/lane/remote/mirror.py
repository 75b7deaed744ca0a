"""Lanes in an object store: the bucket is the durable, shared lane; ``data_dir`` its
local staging area and read cache.

Layout in the bucket, beside the local one::

    <prefix>/<lane>/topic=<t>/partition=<p>/<first:020d>-<last:020d>.g<generation:010d>.parquet

* **Write** (the partition's owner): a segment is written locally as always (temp →
  fsync → link), then PUT — dead letters, decoded, raw, in that order — each under its
  final name, created once (``If-None-Match: *``). The raw object's PUT is the durable
  point: only then is the position committed. The member's fence is asked before each
  PUT, like before each rename.
* **Fencing.** The name carries the member's consumer-group generation. A zombie — a
  member paused past its session that wakes and PUTs what it had — writes an older
  generation than the partition's next owner, so where two raw objects overlap, the
  newest generation's is the lane and the older one is not (``resolve``); names never
  collide across members, and within one generation the conditional PUT refuses a
  second writer.
* **Origins.** The partition's origin record (``lane/origin.py``) is PUT once before
  its first raw object and fetched with them (``lane/remote/origin_sync.py``).
* **Restore** (a new owner, at assignment): the partition's local lane is made the
  bucket's — objects fetched, local files the bucket lacks (written but never PUT, so
  never committed) removed — before coverage decides where to resume.
* **Sync** (every replica, for partitions it does not own): the same, in the
  background, so any replica serves every partition's history from its cache. A local
  file the bucket lacks is removed only once it is old enough that no write of this
  process can still be on its way to the bucket.

Its length: publish, restore, sync and the deletions of upkeep share one lock per
partition and one order of objects (origin, dead letters, decoded, raw); apart, each
module would restate the order it must keep with the others. The records beside the
segments (origins, a sink's refused lane) are modules of their own.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import quote, unquote

from thalweg.errors import SegmentConflictError
from thalweg.lane.durable import TMP_MARK
from thalweg.lane.layout import Lane, LaneLayout
from thalweg.lane.remote.objectstore import ObjectStore
from thalweg.lane.remote.origin_sync import fetch_origin, publish_origin
from thalweg.lane.remote.refused_sync import sync_refused
from thalweg.lane.upkeep.retention import raise_floor

log = logging.getLogger(__name__)

_OBJECT_RE = re.compile(r"^(\d{20})-(\d{20})\.g(\d{10})\.parquet$")
_LOCAL_RE = re.compile(r"^(\d{20})-(\d{20})\.parquet$")
_PARTITION_RE = re.compile(r"^raw/topic=([^/]+)/partition=(\d+)/")
_ORDER = (Lane.DLQ, Lane.DECODED, Lane.RAW)  # the raw object last: it makes it durable
_FETCHERS = 8  # objects fetched at once (a store's latency, not its bandwidth, is the cost)


@dataclass(frozen=True, slots=True)
class LaneObject:
    """One segment object: its offsets, the writer's generation, its key."""

    first: int
    last: int
    generation: int
    rel: str

    @property
    def name(self) -> str:
        """The local file name (no generation)."""
        return f"{self.first:020d}-{self.last:020d}.parquet"


@dataclass(frozen=True, slots=True)
class SyncReport:
    fetched: int
    removed: int
    superseded: int


def object_name(local_name: str, generation: int) -> str:
    stem = local_name.removesuffix(".parquet")
    return f"{stem}.g{max(generation, 0):010d}.parquet"


def resolve(objects: Iterable[LaneObject]) -> list[LaneObject]:
    """The objects that are the lane: where raw objects overlap, the newest
    generation's wins (an older one overlapping it is a zombie's, or a crashed
    member's that its successor wrote again); among one generation, the widest."""
    chosen: list[LaneObject] = []
    for obj in sorted(objects, key=lambda o: (-o.generation, -(o.last - o.first), o.first)):
        if all(obj.last < c.first or obj.first > c.last for c in chosen):
            chosen.append(obj)
    return sorted(chosen, key=lambda o: o.first)


class LaneMirror:
    """Keeps a local lane and the bucket's in step, per partition."""

    def __init__(self, layout: LaneLayout, store: ObjectStore, *, orphan_age_s: float = 120.0):
        self.layout = layout
        self.store = store
        self.orphan_age_s = orphan_age_s
        self._locks: dict[tuple[str, int], threading.Lock] = {}
        self._leaving: dict[str, float] = {}  # local file → when it was first out of the lane
        self._orphans: dict[str, float] = {}  # twin object → when first seen without raw
        self._guard = threading.Lock()
        self._origins: set[tuple[str, int]] = set()  # origin records put by this process

    # -- names -----------------------------------------------------------------------

    def _dir_rel(self, lane: Lane, topic: str, partition: int) -> str:
        return f"{lane.value}/topic={quote(topic, safe='')}/partition={partition}/"

    def _lock(self, topic: str, partition: int) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((topic, partition), threading.Lock())

    # -- write -----------------------------------------------------------------------

    def publish(
        self, topic: str, partition: int, name: str, generation: int, fence: Callable[[], None]
    ) -> None:
        """PUT a locally durable segment (its twins first); durable when this returns.

        Raises:
            OwnershipLostError: (from ``fence``) this member may not own it any more.
            SegmentConflictError: the name exists with other bytes.
            LaneError: the store did not take it (retriable: call again).
        """
        with self._lock(topic, partition):
            if (topic, partition) not in self._origins:  # before its first raw object
                fence()
                raw_dir = self._dir_rel(Lane.RAW, topic, partition)
                publish_origin(self.store, self.layout, topic, partition, raw_dir)
                self._origins.add((topic, partition))
            raw_rel = self._dir_rel(Lane.RAW, topic, partition) + object_name(name, generation)
            for lane in _ORDER:
                path = self.layout.partition_dir(lane, topic, partition) / name
                if lane is not Lane.RAW and not path.exists():
                    continue  # no dead letters, or no decoded twin (rebuilt from raw)
                fence()
                rel = self._dir_rel(lane, topic, partition) + object_name(name, generation)
                try:
                    self.store.put_new(rel, path)
                except SegmentConflictError:
                    if lane is Lane.RAW or self.store.exists(raw_rel):
                        raise
                    # A twin PUT before a raw PUT that never happened (the fence refused
                    # it): without its raw object it is nobody's, so it is replaced.
                    self.store.delete([rel])
                    self.store.put_new(rel, path)

    def publish_twins(self, topic: str, partition: int, name: str) -> int:
        """PUT the decoded twin and dead letters of segment ``name``, rebuilt locally
        after their first write failed, beside its raw object already in the store
        (under that object's generation). Without this a bucket's readers — every other
        replica, ``twg verify`` — would miss the decoded rows for good: the raw object
        went up without them. None when the raw object is not in the store (its own
        ``publish`` carries the twins); a twin already there is left as it is.

        Returns:
            How many objects were put.

        Raises:
            LaneError: the store did not take one (retriable: call again).
        """
        with self._lock(topic, partition):
            raws = [o for o in self.objects(Lane.RAW, topic, partition) if o.name == name]
            if not raws:
                return 0
            generation = max(o.generation for o in raws)
            put = 0
            for lane in (Lane.DLQ, Lane.DECODED):
                path = self.layout.partition_dir(lane, topic, partition) / name
                if not path.exists():
                    continue
                rel = self._dir_rel(lane, topic, partition) + object_name(name, generation)
                if self.store.exists(rel):
                    continue  # there already
                try:
                    self.store.put_new(rel, path)
                except SegmentConflictError:
                    continue  # put meanwhile
                put += 1
            return put

    def sync_refused(self, sink: str, *, put: bool = True) -> tuple[int, int]:
        """Sink ``sink``'s dead-letter lane the same here and in the bucket
        (``lane/remote/refused_sync.py``); (put, fetched).

        Raises:
            LaneError: the store did not answer or take a file (retriable).
        """
        return sync_refused(self.layout, self.store, sink, put=put)

    def landed(self, topic: str, partition: int, name: str, generation: int) -> bool:
        """Whether the segment's raw object is in the store (durable there)."""
        rel = self._dir_rel(Lane.RAW, topic, partition) + object_name(name, generation)
        return self.store.exists(rel)

    def discard_local(self, topic: str, partition: int, name: str) -> None:
        """Remove a segment written locally whose raw object never reached the store:
        it was never durable, and its records are fetched and written again."""
        for lane in _ORDER:
            (self.layout.partition_dir(lane, topic, partition) / name).unlink(missing_ok=True)

    # -- read ------------------------------------------------------------------------

    def objects(self, lane: Lane, topic: str, partition: int) -> list[LaneObject]:
        base = self._dir_rel(lane, topic, partition)
        out = []
        for rel in self.store.listing(base):
            m = _OBJECT_RE.match(rel[len(base) :])
            if m:
                out.append(LaneObject(int(m[1]), int(m[2]), int(m[3]), rel))
        return out

    def partitions(self) -> dict[str, set[int]]:
        """Every (topic, partition) the bucket's raw lane holds."""
        found: dict[str, set[int]] = {}
        for rel in self.store.listing("raw/"):
            m = _PARTITION_RE.match(rel)
            if m:
                found.setdefault(unquote(m[1]), set()).add(int(m[2]))
        return found

    # -- retention and compaction (the owner) ---------------------------------------

    def publish_floor(self, topic: str, partition: int) -> None:
        """Put the partition's retention floor (lane/upkeep/retention.py) where every replica's
        sync finds it, before anything below it is deleted from the store."""
        path = self.layout.floor_path(topic, partition)
        if path.exists():
            self.store.put(self._floor_rel(topic, partition), path.read_bytes())

    def delete_below(self, topic: str, partition: int, floor: int) -> int:
        """Remove every object of the partition wholly below ``floor`` (retention swept
        the local files after its grace); the objects removed."""
        with self._lock(topic, partition):
            doomed = [
                o.rel
                for lane in _ORDER
                for o in self.objects(lane, topic, partition)
                if o.last < floor
            ]
            self.store.delete(doomed)
            return len(doomed)

    def delete_contained(self, topic: str, partition: int) -> int:
        """Remove the objects the lane no longer holds because another, of the same or a
        newer generation, contains them (a compaction's parts once its merged object is
        in the store; a superseded object inside a newer one); the objects removed."""
        with self._lock(topic, partition):
            raw = self.objects(Lane.RAW, topic, partition)
            lane = resolve(raw)
            gone = {
                (o.name, o.generation)
                for o in raw
                if o not in lane
                and any(
                    k.generation >= o.generation and k.first <= o.first and o.last <= k.last
                    for k in lane
                )
            }
            twins = [
                o.rel
                for lane_ in (Lane.DLQ, Lane.DECODED)
                for o in self.objects(lane_, topic, partition)
                if (o.name, o.generation) in gone
            ]
            # The twins in a request of their own before the raw objects: what is found
            # again next run is a raw object's (``gone`` is read from them), so a crash or
            # a refused key between the two leaves nothing that is never removed.
            self.store.delete(twins)
            doomed = [o.rel for o in raw if (o.name, o.generation) in gone]
            self.store.delete(doomed)
            return len(twins) + len(doomed)

    def delete_orphans(self, topic: str, partition: int, age_s: float) -> int:
        """Remove twin objects (decoded, dead letters) whose raw object is not in the
        store — a publish that stopped between its twins' PUTs and the raw one (a crash,
        a fence that refused, the store failing), which nothing reads and nothing else
        removes — once seen so for ``age_s`` (another member's publish may be between
        the two PUTs; this process's are not, under the partition's lock). A publish
        retried later PUTs its twins again. The objects removed."""
        with self._lock(topic, partition):
            raw = {(o.name, o.generation) for o in self.objects(Lane.RAW, topic, partition)}
            now = time.monotonic()
            seen: set[str] = set()
            doomed: list[str] = []
            for lane in (Lane.DLQ, Lane.DECODED):
                for o in self.objects(lane, topic, partition):
                    if (o.name, o.generation) in raw:
                        continue
                    seen.add(o.rel)
                    if now - self._orphans.setdefault(o.rel, now) >= age_s:
                        doomed.append(o.rel)
            mine = (self._dir_rel(lane, topic, partition) for lane in (Lane.DLQ, Lane.DECODED))
            prefixes = tuple(mine)
            for rel in [r for r in self._orphans if r.startswith(prefixes) and r not in seen]:
                del self._orphans[rel]  # its raw object landed (or it went): not an orphan
            self.store.delete(doomed)
            for rel in doomed:
                self._orphans.pop(rel, None)
                log.info("removed orphan object %s: its raw object is not in the store", rel)
            return len(doomed)

    def sync_floors(self) -> None:
        """Take every partition's retention floor from the store (at start, before
        serving: ``earliest`` must never name a position the bucket no longer has)."""
        for topic, partitions in self.partitions().items():
            for p in partitions:
                self._sync_floor(topic, p)

    def _floor_rel(self, topic: str, partition: int) -> str:
        return f"retention/topic={quote(topic, safe='')}/{partition}.json"

    def _sync_floor(self, topic: str, partition: int) -> None:
        body = self.store.read(self._floor_rel(topic, partition))
        if body is None:
            return
        try:
            parsed = json.loads(body)
            floor = int(parsed["floor"])
            steps = [(int(f), float(at)) for f, at in parsed.get("steps", [])]
        except (ValueError, KeyError, TypeError):
            log.warning("%s[%d]: unreadable retention floor in the store", topic, partition)
            return
        # The rise keeps the time it rose at in the bucket, not the time this replica
        # learned of it: a read below the floor is answered only through the owner's
        # grace, on every replica alike (LaneCatalog.still_held). A rise the bucket no
        # longer times was swept there: long past its grace.
        local = self.layout.floor(topic, partition)
        rises = [at for f, at in steps if f > local]
        raise_floor(
            self.layout, topic, partition, floor, min([*rises, time.time()]) if rises else 0.0
        )

    # -- restore and sync ------------------------------------------------------------

    def restore(self, topic: str, partition: int) -> SyncReport:
        """Make the partition's local lane the bucket's, now (its new owner, at
        assignment): nothing local that the bucket lacks survives."""
        return self._sync(topic, partition, orphan_age_s=0.0)

    def sync(self, topic: str, partition: int) -> SyncReport:
        """Fetch what other members wrote of a partition this gateway does not own."""
        return self._sync(topic, partition, orphan_age_s=self.orphan_age_s)

    def _sync(self, topic: str, partition: int, orphan_age_s: float) -> SyncReport:
        with self._lock(topic, partition):
            self._sync_floor(topic, partition)
            raw = self.objects(Lane.RAW, topic, partition)
            lane_objects = resolve(raw)
            keep = {(o.name, o.generation) for o in lane_objects}
            names = {o.name for o in lane_objects}
            raw_dir = self.layout.partition_dir(Lane.RAW, topic, partition)
            # Twins are fetched before their raw file: with every raw file here, so are
            # they, and the twin lanes need no listing (a steady sync is one LIST).
            behind = any(not (raw_dir / n).exists() for n in names)
            if behind or not orphan_age_s:  # put before the raw objects it is behind on
                fetch_origin(self.store, self.layout, topic, partition)
            fetched = removed = 0
            for lane in _ORDER:
                if lane is Lane.RAW:
                    wanted = {o.name: o for o in lane_objects}
                elif behind:
                    wanted = {
                        o.name: o
                        for o in self.objects(lane, topic, partition)
                        if (o.name, o.generation) in keep
                    }
                else:
                    wanted = {}
                directory = self.layout.partition_dir(lane, topic, partition)
                removed += self._remove_unknown(directory, names, orphan_age_s)
                missing = [(o.rel, directory / n) for n, o in sorted(wanted.items())]
                missing = [(rel, dest) for rel, dest in missing if not dest.exists()]
                if missing:  # each lane whole before the next: the raw files last
                    with ThreadPoolExecutor(min(_FETCHERS, len(missing))) as pool:
                        fetched += sum(pool.map(lambda m: self.store.get(*m), missing))
            return SyncReport(fetched, removed, len(raw) - len(lane_objects))

    def _remove_unknown(self, directory: os.PathLike[str], names: set[str], age_s: float) -> int:
        """Remove local segments the bucket's lane does not hold — never made durable (a
        crash between the local write and the PUT), a zombie's, a compaction's parts,
        below a retention floor — once they have been out of the lane for ``age_s``
        (reads in flight finish; a write of this process on its way to the bucket lands
        first). ``age_s`` 0: at once (a new owner's restore)."""
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return 0
        now = time.monotonic()
        removed = 0
        for entry in entries:
            if TMP_MARK in entry.name or not _LOCAL_RE.match(entry.name):
                continue
            if entry.name in names:
                self._leaving.pop(entry.path, None)
                continue
            since = self._leaving.setdefault(entry.path, now)
            if age_s and now - since < age_s:
                continue
            os.unlink(entry.path)
            self._leaving.pop(entry.path, None)
            removed += 1
            log.info("removed %s: not in the object store's lane", entry.path)
        return removed
