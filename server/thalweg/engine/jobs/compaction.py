"""The compaction job: every ``compaction.interval_s``, each partition this gateway owns
(ingests) gets its small closed segments merged (``lane.compaction``) and the parts of
merges older than the grace period deleted."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from thalweg.config.models import ThalwegConfig
from thalweg.errors import InvariantError
from thalweg.lane.coverage import is_compacted
from thalweg.lane.layout import Lane, LaneLayout
from thalweg.lane.remote.mirror import LaneMirror
from thalweg.lane.upkeep.compaction import files_per_partition, merge, plan_runs, sweep_merged
from thalweg.ops.metrics import Metrics
from thalweg.ops.periodic import run_every

log = logging.getLogger(__name__)


def _unfenced() -> None:
    """Compaction rewrites what this member already made durable and committed: a merged
    object that lands after the partition moved holds the same records (contained in
    nothing newer), so it needs no fence."""


class CompactionJob:
    """Args:
    owned: the (topic, partition) pairs this gateway ingests now.
    """

    def __init__(
        self,
        cfg: ThalwegConfig,
        layout: LaneLayout,
        metrics: Metrics,
        owned: Callable[[], Iterable[tuple[str, int]]],
        mirror: LaneMirror | None = None,
        generation: Callable[[str], int] = lambda _topic: 0,
    ) -> None:
        self.mirror = mirror
        self.generation = generation
        self.cfg = cfg.compaction
        self.raw_cfg = cfg.raw_lane
        self.layout = layout
        self.metrics = metrics
        self.owned = owned
        # With retention by age, a merged file spans at most a quarter of the bound: it
        # goes at most that late, and one absorbing every new segment cannot keep the
        # floor down for ever (lane/upkeep/compaction.py, plan_runs).
        age = cfg.retention.max_age_s if cfg.retention.enabled else None
        self.span_s = age / 4 if age is not None else None

    def run_once(self, now: float | None = None) -> int:
        """Merge what is due; the runs merged."""
        now = time.time() if now is None else now
        merged = 0
        for topic, p in sorted(set(self.owned())):
            waiting = 0  # segments of runs left for a later pass (a twin being rebuilt)
            for run in plan_runs(self.layout, topic, p, self.cfg, now, span_s=self.span_s):
                if (topic, p) not in set(self.owned()):
                    # Revoked (and perhaps assigned again: start-up repair may be running
                    # on it) since the pass began: the next pass decides.
                    break
                started = time.monotonic()
                done = merge(self.layout, topic, p, run, self.raw_cfg)
                if done is None:
                    waiting += len(run)
                    continue
                merged += 1
                self.metrics.compaction_merged.labels(topic).inc(done.parts)
                self.metrics.compaction_seconds.observe(time.monotonic() - started)
            if self.mirror is not None:
                self._publish_merged(topic, p)
            sweep_merged(self.layout, topic, p, self.cfg.grace_s, now)
            if self.mirror is not None:
                self.mirror.delete_contained(topic, p)
            self.metrics.lane_files.labels(topic, str(p)).set(
                files_per_partition(self.layout, topic, p)
            )
            self.metrics.compaction_backlog.labels(topic, str(p)).set(waiting)
        return merged

    def _publish_merged(self, topic: str, p: int) -> None:
        """Every merged file in the object store before any of its parts leaves it (a
        merge whose PUT failed is PUT by the next run; lane/remote/mirror.py)."""
        if self.mirror is None:
            raise InvariantError("self.mirror is not set")
        stored = {o.name for o in self.mirror.objects(Lane.RAW, topic, p)}
        for seg in self.layout.segments(Lane.RAW, topic, p):
            if is_compacted(seg) and seg.path.name not in stored:
                self.mirror.publish(topic, p, seg.path.name, self.generation(topic), _unfenced)

    async def run(self, stop: asyncio.Event) -> None:
        await run_every(stop, self.cfg.interval_s, self.run_once, "compaction run")
