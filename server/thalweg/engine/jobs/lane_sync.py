"""Every replica's copy of the partitions it does not own, from the object store —
and, for the partitions it owns, the sweep of orphaned twin objects.

With lanes in an object store (lane/remote/mirror.py), the partition's owner writes and PUTs
its segments; every other replica fetches them into its cache here, every
``object_store.sync_interval_s``, so any replica serves every partition's durable
history (the live tail stays with the owner: docs/lanes.md, "Many gateways").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from thalweg.group.owners import OwnerDirectory
from thalweg.lane.remote.mirror import LaneMirror
from thalweg.sources.base import PartitionKey

log = logging.getLogger(__name__)

PARTITIONS_AT_ONCE = 4  # each with lane/remote/mirror.py's own fetchers: within ObjectStore.POOL


class LaneSync:
    """Fetches other members' segments of the configured topics."""

    def __init__(
        self,
        mirror: LaneMirror,
        topics: Callable[[], list[str]],
        owned: Callable[[], list[PartitionKey]],
        owners: OwnerDirectory,
        interval_s: float,
        synced: Callable[[str, int], None] = lambda _topic, _partition: None,
        sinks: Callable[[], list[str]] = list,
    ) -> None:
        self._mirror = mirror
        self._sinks = sinks  # whose dead-letter lanes every replica serves too
        self.synced = synced  # told of each partition whose files a sync changed
        self._warm: set[str] = set()  # topics synced whole at least once
        self._topics = topics
        self._owned = owned
        self._owners = owners
        self._interval_s = interval_s
        self._swept_at = float("-inf")

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            owned = set(self._owned())  # read on the loop: the runners change it there
            try:
                await asyncio.to_thread(self.once, owned)
                await asyncio.to_thread(self.refused)
                if time.monotonic() - self._swept_at >= self._mirror.orphan_age_s / 2:
                    await asyncio.to_thread(self.sweep, owned)
            except Exception:
                log.warning("object-store sync failed; the next run decides", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)

    def once(self, owned: set[PartitionKey], topics: list[str] | None = None) -> int:
        """One pass over ``topics`` (the configured ones); returns how many segments
        were fetched. Partitions are synced side by side: a store's latency, not its
        bandwidth, is the cost, and a replica that never read a topic waited for every
        partition in turn before serving it."""
        stored = self._mirror.partitions()
        todo = [
            (topic, p)
            for topic in (self._topics() if topics is None else topics)
            for p in sorted(stored.get(topic, set()) | set(self._owners.partitions(topic)))
            if (topic, p) not in owned
        ]
        fetched = 0
        if todo:
            with ThreadPoolExecutor(min(PARTITIONS_AT_ONCE, len(todo))) as pool:
                fetched = sum(pool.map(self._sync_one, todo))
        self._warm.update(topic for topic, _ in todo)
        return fetched

    def refused(self) -> int:
        """Fetch the sinks' dead-letter lanes (``lane/remote/refused_sync.py``): what a
        sink's feeder set aside, wherever it runs, is read from any replica (a dlq
        ticket's ``"sink"``); the files fetched. Fetched only: each lane's one writer
        is its sink's feeder, which puts."""
        return sum(self._mirror.sync_refused(s, put=False)[1] for s in self._sinks())

    def sweep(self, owned: set[PartitionKey]) -> int:
        """Remove the orphaned twin objects of the partitions this replica owns
        (``LaneMirror.delete_orphans``: each seen orphaned for ``orphan_age_s`` first,
        so a sweep runs twice as often); the objects removed."""
        self._swept_at = time.monotonic()
        topics = set(self._topics())
        return sum(
            self._mirror.delete_orphans(topic, p, self._mirror.orphan_age_s)
            for topic, p in sorted(owned)
            if topic in topics
        )

    def _sync_one(self, key: PartitionKey) -> int:
        report = self._mirror.sync(*key)
        if report.fetched or report.removed:
            self.synced(*key)  # readers see the new segments now, not a cache TTL later
        return report.fetched

    def warm(self, topic: str) -> None:
        """Read-through for a topic a read finds cold — not yet synced whole since this
        replica started: synced now, on the reader's thread (waiting on a background
        pass's partitions where one is under way), so the first read is answered whole
        instead of in part or empty until that pass ends. Warm topics are left to the
        background passes: a read costs no request."""
        if topic in self._warm:
            return
        try:
            self.once(set(self._owned()), [topic])
        except Exception:  # the background pass retries; the read answers what is here
            log.warning("read-through sync of %s failed", topic, exc_info=True)
