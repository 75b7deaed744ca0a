"""The broker watch: every few seconds, on its own task, what the fetch loop cannot see.

aiokafka's fetch returns nothing, not an error, while every broker is away — and can
block for as long as the outage lasts — so /ready learns of an outage here: the source
asks the cluster for metadata. The same round resumes partitions whose divergence an
operator resolved, holds partitions whose log shrank under the gateway, and names
configured topics the broker does not have.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from thalweg.engine.context import SourceState
from thalweg.engine.ingest.partitions import Partitions
from thalweg.errors import SourceError
from thalweg.ops.health import State

log = logging.getLogger(__name__)

PROBE_EVERY_S = 2.0


class BrokerWatch:
    """Broker liveness, resolved holds, shrunk logs and missing topics of one source."""

    def __init__(self, state: SourceState, partitions: Partitions) -> None:
        self.s = state
        self._partitions = partitions
        self._missing_since: float | None = None
        self._topics_registered = False

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PROBE_EVERY_S)
            if not stop.is_set():
                await self.probe()
                await self._partitions.check_held()
                await self.check_topics()
                await self._partitions.check_log_ends()

    async def probe(self) -> None:
        """Mark the source down while no broker answers, and up again once one does."""
        s = self.s
        ok = await s.source.probe()
        if not ok and not s.broker_down:
            s.broker_down = True
            s.ctx.health.set(s.component, State.DOWN, "no broker answers")
            log.error("source %s: no broker answers; fetching resumes when one does", s.cfg.name)
        elif ok and s.broker_down:
            s.broker_down = False
            s.ctx.health.set(s.component, State.UP, "connected")
            log.warning("source %s: brokers answer again", s.cfg.name)

    async def check_topics(self) -> None:
        """Say in /health which configured topics the broker does not have; past
        ``missing_topic_grace_s`` they gate readiness (a typo or a deleted topic would
        otherwise look like a quiet topic)."""
        s = self.s
        grace_s = s.features.missing_topic_grace_s
        if grace_s is None or s.broker_down:
            return
        try:
            missing = await s.source.missing_topics()
        except SourceError as exc:
            log.debug("topic check skipped: %s", exc)
            return
        name = f"topics:{s.cfg.name}"
        now = time.monotonic()
        if not missing:
            self._missing_since = None
            if self._topics_registered:
                s.ctx.health.set(name, State.UP, "every configured topic exists")
            return
        if self._missing_since is None:
            self._missing_since = now
            log.warning("source %s: topics not on the broker: %s", s.cfg.name, missing)
        if now - self._missing_since < grace_s:
            return
        if not self._topics_registered:
            s.ctx.health.register(name, "topics", gates_readiness=True)
            self._topics_registered = True
        detail = f"configured topic(s) not on the broker: {', '.join(missing)}"
        if s.ctx.health.state(name) is not State.DOWN:
            log.error("source %s: %s", s.cfg.name, detail)
        s.ctx.health.set(name, State.DOWN, detail, info={"missing_topics": missing})
