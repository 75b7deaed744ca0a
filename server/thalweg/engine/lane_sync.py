"""Every replica's copy of the partitions it does not own, from the object store.

With lanes in an object store (lane/mirror.py), the partition's owner writes and PUTs
its segments; every other replica fetches them into its cache here, every
``object_store.sync_interval_s``, so any replica serves every partition's durable
history (the live tail stays with the owner: docs/lanes.md, "Many gateways").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from thalweg.lane.mirror import LaneMirror
from thalweg.lane.owners import OwnerDirectory
from thalweg.sources.base import PartitionKey

log = logging.getLogger(__name__)


class LaneSync:
    """Fetches other members' segments of the configured topics."""

    def __init__(
        self,
        mirror: LaneMirror,
        topics: Callable[[], list[str]],
        owned: Callable[[], list[PartitionKey]],
        owners: OwnerDirectory,
        interval_s: float,
    ) -> None:
        self._mirror = mirror
        self._topics = topics
        self._owned = owned
        self._owners = owners
        self._interval_s = interval_s

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            owned = set(self._owned())  # read on the loop: the runners change it there
            try:
                await asyncio.to_thread(self.once, owned)
            except Exception:
                log.warning("object-store sync failed; the next run decides", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)

    def once(self, owned: set[PartitionKey]) -> int:
        """One pass; returns how many segments were fetched."""
        stored = self._mirror.partitions()
        fetched = 0
        for topic in self._topics():
            for p in sorted(stored.get(topic, set()) | set(self._owners.partitions(topic))):
                if (topic, p) not in owned:
                    fetched += self._mirror.sync(topic, p).fetched
        return fetched
