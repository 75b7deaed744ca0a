"""Backpressure through the DAG, when asked for: a source waits for what is below it.

By default nothing below the raw lane slows a source (ADR 0021): nodes and sinks read
the durable lanes and fall behind visibly, their backlog held on disk. With
``recovery.max_lag_records`` set, the lanes become a bounded buffer instead: a source
pauses fetching while any sink or node lane fed from one of its topics lags its lane by
more than that many positions, and resumes once every one is back under 80 % of it —
so the source's budget is the minimum across the nodes and sinks below it. The cost is
the other guarantee: a sink that is down long enough then holds the source back, which
is what the setting asks for.

The lags are the feeders' own (``SinkFeeder.lag_by_topic``), read once a second on the
event loop; the runner asks :meth:`LagGate.holding` before each fetch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

from thalweg.ops.periodic import run_every
from thalweg.recovery.feeder import SinkFeeder

log = logging.getLogger(__name__)

RESUME_AT = 0.8  # of the limit: hysteresis, so a source does not flap at the bound
REFRESH_S = 1.0


class LagGate:
    """Which topics must wait, from the lags of the feeders below them."""

    def __init__(self, feeders: Sequence[SinkFeeder], limit: int) -> None:
        self.feeders = feeders
        self.limit = limit
        self._lags: dict[str, dict[str, int]] = {}  # topic → sink → lag
        self._holding: dict[str, str] = {}  # topic → why it waits

    def holding(self, topics: Iterable[str]) -> str | None:
        """Why a source of ``topics`` must wait now, or None."""
        for t in topics:
            why = self._holding.get(t)
            if why is not None:
                return why
        return None

    def refresh(self) -> None:
        """Read every feeder's lag per topic and decide which topics wait."""
        lags: dict[str, dict[str, int]] = {}
        for f in self.feeders:
            for topic, lag in f.lag_by_topic().items():
                lags.setdefault(topic, {})[f.sink.name] = lag
        self._lags = lags
        for topic, by_sink in lags.items():
            sink, worst = max(by_sink.items(), key=lambda kv: kv[1])
            if worst > self.limit and topic not in self._holding:
                why = (
                    f"{sink} lags {topic} by {worst} positions "
                    f"(recovery.max_lag_records = {self.limit})"
                )
                log.warning("pausing %s: %s", topic, why)
                self._holding[topic] = why
            elif worst <= self.limit * RESUME_AT and topic in self._holding:
                log.info("resuming %s: every sink within %d positions", topic, worst)
                del self._holding[topic]

    async def run(self, stop: asyncio.Event) -> None:
        await run_every(stop, REFRESH_S, self.refresh, "lag gate refresh", in_thread=False)
