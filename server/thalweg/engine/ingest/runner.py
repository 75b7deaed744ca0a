"""One source's ingest loop: fetch → admit → decode → buffer, with backpressure.

The loop only fetches and buffers. Where each partition resumes and whether its log
still continues the lane is ``partitions``; durable segments and commits are
``checkpoint`` (the commit invariant lives there); broker liveness and missing topics
are ``watch``; ownership doubts are the ``fence``. The loop drives them: every turn it
beats the health clock, stops writing while ownership is in doubt, pauses while more
than ``max_buffered_bytes`` is not yet durable, fetches within the poll budget, admits
and buffers each partition's batch, and starts the flushes that are due.

Its length: the loop and its start (login and connect retries, the wait for a group's
first assignment, said every ``START_WARN_EVERY_S``) share the runner's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pyarrow as pa

from thalweg.engine.context import (
    LOGIN_RETRY_BASE_S,
    LaneContext,
    SourceConfig,
    SourceState,
    new_backoff,
)
from thalweg.engine.ingest.budget import Budget, SizeEstimator, budget_for
from thalweg.engine.ingest.buffer import PartitionBuffer
from thalweg.engine.ingest.checkpoint import Checkpoint
from thalweg.engine.ingest.decode_stage import DecodeStage
from thalweg.engine.ingest.fence import OwnershipFence
from thalweg.engine.ingest.partitions import Partitions
from thalweg.engine.ingest.rebuilds import DecodedRebuilds
from thalweg.engine.ingest.throttle import Throttle
from thalweg.engine.ingest.watch import BrokerWatch
from thalweg.errors import LoginRefusedError, SourceError
from thalweg.lane.read.live import LiveEntry
from thalweg.ops.health import State
from thalweg.ops.retry import Backoff
from thalweg.ops.tracing import links_from_headers
from thalweg.pipeline.decoders import TopicDecoders
from thalweg.sources import load_source_class
from thalweg.sources.base import PartitionKey, Source

log = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 100
# How often a start that has not finished is logged (a group that does not settle).
START_WARN_EVERY_S = 30.0

__all__ = ["SourceRunner"]


class SourceRunner:
    """Runs one configured source (Kafka or Pulsar) until asked to stop."""

    def __init__(self, cfg: SourceConfig, ctx: LaneContext) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.component = f"source:{cfg.name}"
        source: Source = load_source_class(cfg.kind)(cfg, ctx.columns, ctx.owners)
        self.source = source
        features = source.features()
        session = features.session
        fence = (
            OwnershipFence.for_session(
                session.timeout_ms, session.heartbeat_interval_ms, source.membership
            )
            if session is not None
            else None
        )
        self.state = SourceState(cfg, ctx, source, fence, self.component, features)
        self.checkpoint = Checkpoint(self.state, features.dead_letters)
        ctx.health.register(self.component, "source", gates_readiness=True)
        self.decoders = TopicDecoders(
            cfg,
            ctx.layout,
            ctx.columns,
            ctx.metrics,
            ctx.health,
            self.component,
            self._retry,
            new_backoff,
        )
        for topic in cfg.topics:
            self.decoders.for_topic(topic)
        self.partitions = Partitions(self.state, self.checkpoint, self.decoders)
        self.rebuilds = DecodedRebuilds(ctx, lambda key: key in self.state.parts, self.decoders.get)
        self.checkpoint.on_decoded_missing = self.rebuilds.schedule
        self.watch = BrokerWatch(self.state, self.partitions)
        self._throttle = Throttle(cfg.max_records_per_s, cfg.max_bytes_per_s)
        self._sizes = SizeEstimator(cfg.record_size_est_bytes)
        self._stage = DecodeStage(cfg.name, self.decoders, ctx.columns, self._sizes)
        self._doubting = False

    # -- read side hooks -----------------------------------------------------------

    def payload_schema(self, topic: str) -> pa.Schema | None:
        return self.decoders.payload_schema(topic)

    def decoded_topics(self) -> set[str]:
        return self.decoders.topics()

    # -- lifecycle -----------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, then flush, commit and leave the group."""
        s = self.state
        await self._start(stop)
        fetch_backoff = new_backoff()
        # Its own task: while no broker answers, aiokafka's fetch can block for as long
        # as the outage lasts, and /ready must say so meanwhile.
        watcher = asyncio.create_task(self.watch.run(stop))
        fence_stop = asyncio.Event()
        fencer = asyncio.create_task(s.fence.run(fence_stop)) if s.fence is not None else None
        try:
            while not stop.is_set():
                if s.fatal is not None:
                    raise s.fatal
                self.ctx.health.beat()
                if await self._fenced(stop) or await self._backpressure():
                    continue
                budget = self._budget()
                started = time.perf_counter()
                try:
                    fetched = await self.source.fetch(budget.deadline_ms, budget.max_records)
                except SourceError as exc:
                    self.ctx.health.set(self.component, State.DOWN, str(exc))
                    with contextlib.suppress(SourceError):
                        await self._retry(fetch_backoff, stop, exc, "fetch")
                    continue
                fetch_backoff.reset()
                fetch_s = time.perf_counter() - started
                nrecords = sum(raw.num_rows for raw in fetched.values())
                nbytes = await self._ingest(fetched, stop) if fetched else 0
                if nrecords:
                    self.ctx.stats.done("fetch", nrecords, nbytes, fetch_s)
                for key in self.source.ended():
                    if (buf := s.parts.get(key)) is not None:
                        buf.ended = True
                if nrecords and self._throttle.active:
                    waited = await self._throttle.admit(nrecords, nbytes)
                    self.ctx.metrics.throttled.labels(self.cfg.name).inc(waited)
                self._schedule(time.monotonic())
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await self.checkpoint.drain()
            fence_stop.set()
            if fencer is not None:
                await asyncio.gather(fencer, return_exceptions=True)
            await self.checkpoint.stop()
            await self.rebuilds.stop()
            self._stage.close()
            await self.source.stop()
            self.ctx.health.set(self.component, State.DOWN, "stopped")

    async def _start(self, stop: asyncio.Event) -> None:
        """Start the source, retrying until it is up. A refused login (wrong credential,
        untrusted certificate) is retried on its own backoff, seconds growing to the
        source's ``login_retry_max_s``: clusters lock an account after a few failed
        logins, and a fast retry loop against a wrong secret is exactly that."""
        backoff = new_backoff()
        retry_max_s = self.state.features.login_retry_max_s
        login_backoff = Backoff(LOGIN_RETRY_BASE_S, retry_max_s or LOGIN_RETRY_BASE_S * 60)
        while True:
            try:
                if not await self._started_unless_stopped(stop):
                    return  # asked to stop first: run() leaves through its shutdown
                self.ctx.health.set(self.component, State.UP, "connected")
                return
            except LoginRefusedError as exc:
                self.ctx.health.set(self.component, State.DOWN, str(exc))
                await self._retry(login_backoff, stop, exc, "login")
            except SourceError as exc:
                self.ctx.health.set(self.component, State.DOWN, str(exc))
                await self._retry(backoff, stop, exc, "connect")

    async def _started_unless_stopped(self, stop: asyncio.Event) -> bool:
        """Start the source, unless ``stop`` comes first: a Kafka start waits for the
        group's first assignment, which a long rebalance holds up (soak, session 22: a
        SIGTERM then ran past the shutdown deadline). Nothing is assigned or durable
        yet, so a start cut short loses nothing. False when stopped first.

        Raises:
            LoginRefusedError, SourceError: as the source's start.
        """
        starting = asyncio.ensure_future(self.source.start(self._on_assigned, self._on_revoked))
        stopping = asyncio.ensure_future(stop.wait())
        began = time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait(
                    {starting, stopping},
                    timeout=START_WARN_EVERY_S,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if done:
                    break
                log.warning(
                    "source %s: still starting after %.0f s (a Kafka source waits for "
                    "its group's first assignment: the broker has not completed a "
                    "rebalance; --client-log-level info shows each join)",
                    self.cfg.name,
                    time.monotonic() - began,
                )
        except asyncio.CancelledError:
            starting.cancel()
            raise
        finally:
            stopping.cancel()
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return False
        starting.result()
        return True

    async def _on_assigned(self, keys: list[PartitionKey]) -> None:
        try:
            await self.partitions.assigned(keys)
        except Exception as exc:
            # aiokafka only logs a failing listener and carries on; a partition without a
            # resume position must never be consumed, so the source stops instead.
            self.state.fatal = exc
            raise

    async def _on_revoked(self, keys: list[PartitionKey]) -> None:
        try:
            await self.partitions.revoked(keys)
        except Exception as exc:
            self.state.fatal = exc
            raise

    # -- ingest --------------------------------------------------------------------

    async def _ingest(
        self, fetched: dict[PartitionKey, pa.RecordBatch], stop: asyncio.Event
    ) -> int:
        """Admit each partition's fetched records, decode them all at once, buffer each
        partition's share and hand it to the live tail; the key + value bytes taken.

        One decode stage a fetch, not one per partition: a decoder call costs about a
        millisecond whatever it decodes, and a thread hop more under load, so a fetch
        over 32 partitions decoded one by one spent most of the gateway's CPU on set-up
        and the live tail fell seconds behind (``pipeline.decode.decode_batches``).
        """
        started = time.perf_counter()
        admitted: list[tuple[PartitionKey, pa.RecordBatch, bool]] = []
        buffers: list[PartitionBuffer] = []
        for key, raw in fetched.items():
            buf = self.state.parts.get(key)
            if buf is None:
                # Only possible for a partition revoked while its fetch was in flight: it
                # is not ours any more and nothing of it was committed, so the new owner
                # reads it.
                log.debug("dropping %d records of unowned %s[%d]", raw.num_rows, *key)
                continue
            got = await self._admit(key, raw)
            if got is None:
                continue
            await self.decoders.resolve(got, stop)
            admitted.append((key, got, buf.decodes))
            buffers.append(buf)
        if not admitted:
            return 0
        staged = await self._stage.run(admitted)
        ctx = self.ctx
        nbytes = rows = 0
        for buf, got in zip(buffers, staged, strict=True):
            key = got.key
            if self.state.parts.get(key) is not buf:
                # Revoked or dropped (ownership in doubt) while decoding: not ours to
                # buffer, and the partition was rewound or is another member's now.
                continue
            buf.add(got.raw, got.decoded, got.failures, got.decoded_bytes, got.raw_bytes)
            for failure in got.failures:
                ctx.metrics.decode_failures.labels(key[0], failure.reason.value).inc()
                ctx.dead_letters[(key[0], failure.reason.value)] += 1
            ctx.live.append(key[0], key[1], LiveEntry(got.first, got.last, got.live, got.decoded))
            labels = self.state.labels(key)
            ctx.metrics.records.labels(*labels).inc(got.raw.num_rows)
            ctx.metrics.bytes.labels(*labels).inc(got.payload_bytes)
            ctx.metrics.consumed.labels(*labels).set(got.last + 1)
            nbytes += got.payload_bytes
            rows += got.raw.num_rows
        ctx.stats.done("decode", rows, nbytes, time.perf_counter() - started)
        return nbytes

    async def _admit(self, key: PartitionKey, raw: pa.RecordBatch) -> pa.RecordBatch | None:
        """The part of ``raw`` the log-continuity checks admit (None: nothing)."""
        ctx = self.ctx
        with ctx.tracing.span(
            "twg.receive", {"topic": key[0], "partition": key[1], "records": raw.num_rows}
        ) as span:
            admitted = await self.partitions.admit(key, raw)
            if admitted is not None and ctx.tracing.enabled:
                offsets = admitted.column(ctx.columns.position)
                span.set_attribute("first_offset", int(offsets[0].as_py()))
                span.set_attribute("last_offset", int(offsets[-1].as_py()))
                headers = admitted.column(ctx.columns.source("headers")).to_pylist()
                for link in links_from_headers(headers):
                    span.add_link(link.context)
            return admitted

    # -- pacing --------------------------------------------------------------------

    def _schedule(self, now: float) -> None:
        """Start the flushes that are due; report buffered bytes and lag."""
        self.checkpoint.start_due(now)
        parts = self.state.parts
        self.ctx.metrics.buffered_bytes.set(sum(b.held_bytes for b in parts.values()))
        waiting_write = waiting_commit = 0
        for (topic, partition), b in parts.items():
            state = self.ctx.live.state(topic, partition)
            durable = b.durable or 0
            consumed = state.high_water if state is not None else None
            labels = (self.cfg.name, topic, str(partition))
            if consumed is not None:
                # In records, not positions: Pulsar positions are not dense.
                waiting_write += b.held_rows
                self.ctx.metrics.lag.labels(*labels, "durable").set(b.held_rows)
                latest = self.source.highwater((topic, partition))
                if latest is not None:
                    self.ctx.metrics.lag.labels(*labels, "broker").set(max(0, latest - consumed))
            waiting_commit += max(0, durable - (b.committed or 0))
            self.ctx.metrics.lag.labels(*labels, "commit").set(max(0, durable - (b.committed or 0)))
        self.ctx.stats.queued("write", waiting_write)
        self.ctx.stats.queued("commit", waiting_commit)

    async def _fenced(self, stop: asyncio.Event) -> bool:
        """While ownership is in doubt: drop every buffer, rewind and pause the
        partitions, and wait for evidence (True: skip this turn of the loop)."""
        s = self.state
        f = s.fence
        if f is None:
            return False
        if f.in_doubt and not f.try_clear():
            if not self._doubting:
                self._doubting = True
                keys = list(s.parts)
                self.source.pause(keys)
                for key in keys:
                    self.partitions.drop(key, f"ownership in doubt ({f.reason})")
                self.ctx.health.set(
                    self.component,
                    State.DEGRADED,
                    f"ownership in doubt ({f.reason}); nothing is written until the group "
                    "confirms this member",
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)
            return True
        if self._doubting:
            self._doubting = False
            if not s.paused:
                self.source.resume([k for k in s.parts if k not in s.held])
            self.ctx.health.set(self.component, State.UP, "connected")
        return False

    async def _backpressure(self) -> bool:
        """Pause fetching while more than ``max_buffered_bytes`` is not yet durable, or
        — with ``recovery.max_lag_records`` — while a sink or node lane below one of
        this source's topics lags too far (``engine.lag_gate``)."""
        s = self.state
        total = sum(b.held_bytes for b in s.parts.values())
        gate = self.ctx.gate
        waiting = gate.holding({t for t, _ in s.parts}) if gate is not None else None
        if total < self.ctx.raw_cfg.max_buffered_bytes and waiting is None:
            if s.paused:
                self.source.resume([k for k in s.parts if k not in s.held])
                s.paused = False
                self.ctx.metrics.paused.labels(self.cfg.name).set(0)
                self.ctx.health.annotate(self.component, paused_by=None)
            return False
        if not s.paused:
            self.source.pause(list(s.parts))
            s.paused = True
            self.ctx.metrics.paused.labels(self.cfg.name).set(1)
        if total < self.ctx.raw_cfg.max_buffered_bytes:  # held by what is below it
            self.ctx.health.annotate(self.component, paused_by=waiting)
            await asyncio.sleep(0.1)
            return True
        # Roll everything now, then wait for a write to finish.
        self._schedule(float("inf"))
        await self.checkpoint.wait_any()
        return True

    def _budget(self) -> Budget:
        """What the next poll may bring: the bytes left under the buffer bound, as
        records at the estimated p95 size."""
        held = sum(b.held_bytes for b in self.state.parts.values())
        free = self.ctx.raw_cfg.max_buffered_bytes - held
        budget = budget_for(free, self._sizes, self.cfg.max_poll_records, POLL_TIMEOUT_MS)
        self.ctx.metrics.budget_records.labels(self.cfg.name).set(budget.max_records)
        return budget

    async def _retry(
        self, backoff: Backoff, stop: asyncio.Event, exc: Exception, stage: str
    ) -> None:
        """Count and wait one retry of ``stage``; when ``stop`` is set meanwhile,
        re-raise ``exc`` (shutting down beats retrying)."""
        self.ctx.metrics.retries.labels(stage).inc()
        delay = await backoff.wait(stop)
        log.warning("%s; retried %s after %.1fs", exc, stage, delay)
        if stop.is_set():
            raise exc
