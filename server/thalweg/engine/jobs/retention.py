"""The retention job: every ``retention.interval_s``, each partition of this gateway's
lanes is held to its bounds (``lane.retention``), never past what a sink has landed
(with ``wait_for_sinks``), and the files below a floor that rose long enough ago go."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from functools import partial

from thalweg.config.models import ThalwegConfig
from thalweg.lane.coverage import scan_coverage
from thalweg.lane.epochs import current_epoch
from thalweg.lane.layout import LaneLayout
from thalweg.lane.remote.mirror import LaneMirror
from thalweg.lane.upkeep.ballast import Ballast
from thalweg.lane.upkeep.retention import decide, raise_floor, sweep, upkeep_lock
from thalweg.ops.metrics import Metrics
from thalweg.ops.periodic import run_every
from thalweg.pipeline.dag import Dag
from thalweg.recovery.coverage import CoverageStore

log = logging.getLogger(__name__)


class RetentionJob:
    def __init__(
        self,
        cfg: ThalwegConfig,
        layout: LaneLayout,
        metrics: Metrics,
        *,
        mirror: LaneMirror | None = None,
        owned: Callable[[], Iterable[tuple[str, int]]] | None = None,
    ) -> None:
        # Lanes in an object store: the owner of a partition keeps it (its floor goes to
        # the store first, then what lies below it); the others follow the store.
        self.mirror = mirror
        self.owned = owned
        self.cfg = cfg
        self.retention = cfg.retention
        self.layout = layout
        self.metrics = metrics
        # Room kept so that a floor can be raised on a full disk (lane/upkeep/ballast.py).
        self.ballast = Ballast(layout.root)
        dag = Dag.of(cfg.pipeline)
        # Every destination fed from the lanes, with the topics it reads.
        self._readers: list[tuple[str, set[str]]] = [(s.name, set(s.topics)) for s in cfg.sinks]
        self._readers += [
            (f"node:{n.name}", {dag.source_topic(n.name)})
            for n in dag.nodes
            if dag.materialised(n.name)
        ]

    def keep_from(
        self, topic: str, partition: int, stores: dict[str, CoverageStore]
    ) -> tuple[int | None, str]:
        """The first position of the partition some sink has not landed, and which."""
        lane = scan_coverage(self.layout, topic, partition).ranges
        key = (topic, partition, current_epoch(self.layout, topic, partition))
        first: tuple[int | None, str] = (None, "")
        for name, topics in self._readers:
            if topic not in topics:
                continue
            gaps = stores[name].gaps(key, lane)
            if gaps and (first[0] is None or gaps[0][0] < first[0]):
                first = (gaps[0][0], f"sink {name}")
        return first

    def run_once(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        # Each sink's store read once a run (another process may be feeding it).
        stores = {}
        if self.retention.wait_for_sinks:
            stores = {n: CoverageStore(self.cfg.gateway.data_dir, n) for n, _ in self._readers}
        owned = set(self.owned()) if self.owned is not None else None
        self.ballast.lay()
        for topic in self.layout.topics():
            for p in self.layout.partitions(topic):
                if self.mirror is not None and (owned is None or (topic, p) not in owned):
                    continue
                with upkeep_lock(self.layout, topic, p):  # never while a merge is written
                    self._keep(topic, p, stores, now)

    def _keep(self, topic: str, p: int, stores: dict[str, CoverageStore], now: float) -> None:
        """One partition held to its bounds: the floor raised, what lies below it swept."""
        keep, who = (None, "")
        if self.retention.wait_for_sinks:
            keep, who = self.keep_from(topic, p, stores)
        decision = decide(
            self.layout, topic, p, self.retention, now=now, keep_from=keep, held_by=who
        )
        if decision.floor is not None:
            floor = decision.floor
            self.ballast.with_room(
                f"raise the floor of {topic}[{p}]",
                partial(raise_floor, self.layout, topic, p, floor, now),
            )
            if self.mirror is not None:
                self.mirror.publish_floor(topic, p)
        self.metrics.retention_held.labels(topic, str(p)).set(1 if decision.held_by else 0)
        if decision.held_by:
            log.info("retention held back: %s", decision.held_by)
        self.metrics.lane_floor.labels(topic, str(p)).set(self.layout.floor(topic, p))
        files, nbytes = self.ballast.with_room(
            f"sweep {topic}[{p}]",
            partial(sweep, self.layout, topic, p, self.retention.grace_s, now),
        )
        if files:
            self.ballast.lay()  # at once: the waiting writes will want the room
        if self.mirror is not None and files:
            self.mirror.delete_below(topic, p, self.layout.floor(topic, p))
        self.metrics.retention_removed_files.labels(topic).inc(files)
        self.metrics.retention_removed_bytes.labels(topic).inc(nbytes)

    async def run(self, stop: asyncio.Event) -> None:
        await run_every(stop, self.retention.interval_s, self.run_once, "retention run")
