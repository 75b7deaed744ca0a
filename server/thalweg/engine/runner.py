"""One source's ingest loop: fetch → raw batch → decode → buffer → durable segment → commit.

The commit invariant lives here. A partition's position is committed only to the
exclusive end of segments whose rename (and directory fsync) has returned, and on
assignment a partition resumes at the end of the lane's coverage when that is ahead of
the committed offset (a crash between rename and commit). Together: nothing lost, and
no record written to the raw lane twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from thalweg.codecs.lane import decode_batch
from thalweg.config.models import KafkaSourceConfig, PulsarSourceConfig, RawLaneConfig
from thalweg.engine.budget import Budget, SizeEstimator, budget_for
from thalweg.engine.buffer import PartitionBuffer
from thalweg.engine.decoders import TopicDecoders
from thalweg.engine.retry import Backoff
from thalweg.engine.throttle import Throttle
from thalweg.errors import LaneError, SourceError, ThalwegError
from thalweg.lane.coverage import repair, resume_position, scan_coverage
from thalweg.lane.layout import META_COVERS_FROM, META_COVERS_TO, LaneLayout, Segment
from thalweg.lane.live import LiveEntry, LiveTail
from thalweg.lane.writer import SegmentWriter
from thalweg.ops.health import Health, State
from thalweg.ops.metrics import Metrics
from thalweg.ops.stats import PipelineStats
from thalweg.ops.tracing import Tracing, links_from_headers
from thalweg.records.columns import MetadataColumns
from thalweg.sinks.dlq_topic import DeadLetterTopic
from thalweg.sources import load_source_class
from thalweg.sources.base import PartitionKey, Source
from thalweg.sources.kafka_security import security_kwargs

log = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 100
RETRY_BASE_S = 0.2
RETRY_MAX_S = 5.0
PROBE_EVERY_S = 2.0  # how often a source checks that a broker answers (for /ready)
RAW_LANE = "raw_lane"


@dataclass(frozen=True, slots=True)
class LaneContext:
    """The shared parts a runner writes through."""

    layout: LaneLayout
    writer: SegmentWriter
    columns: MetadataColumns
    live: LiveTail
    metrics: Metrics
    health: Health
    raw_cfg: RawLaneConfig
    stats: PipelineStats = field(default_factory=PipelineStats)
    tracing: Tracing = field(default_factory=lambda: Tracing(None))


class SourceRunner:
    """Runs one configured source (Kafka or Pulsar) until asked to stop."""

    def __init__(self, cfg: KafkaSourceConfig | PulsarSourceConfig, ctx: LaneContext) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self._throttle = Throttle(cfg.max_records_per_s, cfg.max_bytes_per_s)
        self._broker_down = False
        self._sizes = SizeEstimator(cfg.record_size_est_bytes)
        self._dlq_topic = (
            DeadLetterTopic(
                cfg.dlq_bootstrap_servers or cfg.bootstrap_servers,
                cfg.dlq_topic,
                ctx.columns,
                **security_kwargs(cfg),
            )
            if isinstance(cfg, KafkaSourceConfig) and cfg.dlq_topic
            else None
        )
        self.source: Source = load_source_class(cfg.kind)(cfg, ctx.columns)
        self.component = f"source:{cfg.name}"
        self._parts: dict[PartitionKey, PartitionBuffer] = {}
        self._flushes: dict[PartitionKey, asyncio.Task[None]] = {}
        self._paused = False
        self._fatal: BaseException | None = None
        ctx.health.register(self.component, "source", gates_readiness=True)
        self.decoders = TopicDecoders(
            cfg,
            ctx.layout,
            ctx.columns,
            ctx.metrics,
            ctx.health,
            self.component,
            self._retry,
            lambda: Backoff(RETRY_BASE_S, RETRY_MAX_S),
        )
        for topic in cfg.topics:
            self.decoders.for_topic(topic)

    # -- read side hooks -----------------------------------------------------------

    def payload_schema(self, topic: str) -> pa.Schema | None:
        return self.decoders.payload_schema(topic)

    def decoded_topics(self) -> set[str]:
        return self.decoders.topics()

    # -- lifecycle -----------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, then flush, commit and leave the group."""
        await self._start(stop)
        fetch_backoff = Backoff(RETRY_BASE_S, RETRY_MAX_S)
        # Its own task: while no broker answers, aiokafka's fetch can block for as long
        # as the outage lasts, and /ready must say so meanwhile.
        prober = asyncio.create_task(self._watch_broker(stop))
        try:
            while not stop.is_set():
                if self._fatal is not None:
                    raise self._fatal
                self.ctx.health.beat()
                if await self._backpressure(stop):
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
                nrecords = nbytes = 0
                for key, raw in fetched.items():
                    nrecords += raw.num_rows
                    nbytes += await self._ingest(key, raw, stop)
                if nrecords:
                    self.ctx.stats.done("fetch", nrecords, nbytes, fetch_s)
                if nrecords and self._throttle.active:
                    waited = await self._throttle.admit(nrecords, nbytes)
                    self.ctx.metrics.throttled.labels(self.cfg.name).inc(waited)
                self._schedule(time.monotonic())
        finally:
            prober.cancel()
            await asyncio.gather(prober, return_exceptions=True)
            await self._drain()
            if self._dlq_topic is not None:
                await self._dlq_topic.stop()
            await self.source.stop()
            self.ctx.health.set(self.component, State.DOWN, "stopped")

    async def _start(self, stop: asyncio.Event) -> None:
        backoff = Backoff(RETRY_BASE_S, RETRY_MAX_S)
        while True:
            try:
                await self.source.start(self._on_assigned, self._on_revoked)
                self.ctx.health.set(self.component, State.UP, "connected")
                return
            except SourceError as exc:
                self.ctx.health.set(self.component, State.DOWN, str(exc))
                await self._retry(backoff, stop, exc, "connect")

    # -- rebalance -----------------------------------------------------------------

    async def _on_assigned(self, keys: list[PartitionKey]) -> None:
        try:
            await self._assign(keys)
        except Exception as exc:
            # aiokafka only logs a failing listener and carries on; a partition without a
            # resume position must never be consumed, so the runner stops instead.
            self._fatal = exc
            raise

    async def _on_revoked(self, keys: list[PartitionKey]) -> None:
        try:
            for key in keys:
                await self._flush_now(key)
                self._parts.pop(key, None)
        except Exception as exc:
            self._fatal = exc
            raise

    async def _assign(self, keys: list[PartitionKey]) -> None:
        # aiokafka keeps fetching while this callback awaits. Until a partition's resume
        # position is known and its buffer exists, records fetched for it would have
        # nowhere to go, so the partitions stay paused until then (synchronously, before
        # the first await).
        self.source.pause(keys)
        for key in keys:
            topic, partition = key
            missing = await asyncio.to_thread(repair, self.ctx.layout, topic, partition)
            if missing:
                await asyncio.to_thread(self._redecode, topic, partition, missing)
            cov = await asyncio.to_thread(scan_coverage, self.ctx.layout, topic, partition)
            committed = await self.source.committed(key)
            resume = resume_position(cov, committed)
            if resume is not None:
                self.source.seek(key, resume)
            buf = PartitionBuffer.create(
                topic,
                partition,
                durable=resume,
                committed=committed,
                columns=self.ctx.columns,
                decoder=self.decoders.for_topic(topic),
            )
            self._parts[key] = buf
            self.ctx.live.reset(topic, partition, resume)
            labels = self._labels(key)
            if resume is not None:
                self.ctx.metrics.durable.labels(*labels).set(resume)
                self.ctx.metrics.consumed.labels(*labels).set(resume)
            if committed is not None:
                self.ctx.metrics.committed.labels(*labels).set(committed)
            if resume is not None and (committed is None or resume > committed):
                # The lane already holds these records durably: catch the group up.
                await self._commit(buf)
            log.info(
                "assigned %s[%d]: committed=%s lane_end=%s resume=%s",
                topic,
                partition,
                committed,
                cov.end,
                resume,
            )
        if not self._paused:
            self.source.resume(keys)

    def _redecode(self, topic: str, partition: int, segments: list[Segment]) -> None:
        """Rebuild decoded segments that a failed decoded write left missing."""
        decoder = self.decoders.get(topic)
        if decoder is None:
            return
        for seg in segments:
            path = seg.path
            raw = pq.read_table(path).replace_schema_metadata(None)
            meta = pq.read_schema(path).metadata or {}
            decoded = pa.concat_tables(
                [decode_batch(decoder, b, self.ctx.columns)[0] for b in raw.to_batches()],
                promote_options="permissive",
            )
            covers_from = int(meta.get(META_COVERS_FROM, b"0"))
            covers_to = int(meta.get(META_COVERS_TO, b"0"))
            self.ctx.writer.write(topic, partition, raw, decoded, covers_from, covers_to)

    # -- ingest --------------------------------------------------------------------

    async def _ingest(self, key: PartitionKey, raw: pa.RecordBatch, stop: asyncio.Event) -> int:
        """Decode and buffer one partition's fetched records; their key + value bytes."""
        buf = self._parts.get(key)
        if buf is None:
            # Only possible for a partition revoked while its fetch was in flight: it is
            # not ours any more and nothing of it was committed, so the new owner reads it.
            log.debug("dropping %d records of unowned %s[%d]", raw.num_rows, *key)
            return 0
        ctx = self.ctx
        started = time.perf_counter()
        with ctx.tracing.span(
            "twg.receive", {"topic": key[0], "partition": key[1], "records": raw.num_rows}
        ) as span:
            return await self._receive(key, buf, raw, stop, started, span)

    async def _receive(
        self,
        key: PartitionKey,
        buf: PartitionBuffer,
        raw: pa.RecordBatch,
        stop: asyncio.Event,
        started: float,
        span: Any,
    ) -> int:
        ctx = self.ctx
        offsets = raw.column(ctx.columns.position)
        first, last = int(offsets[0].as_py()), int(offsets[-1].as_py())
        self._sizes.observe(raw.column(ctx.columns.value), raw.column(ctx.columns.source("key")))
        if ctx.tracing.enabled:
            span.set_attribute("first_offset", first)
            span.set_attribute("last_offset", last)
            for link in links_from_headers(raw.column(ctx.columns.source("headers")).to_pylist()):
                span.add_link(link.context)
        await self.decoders.resolve(raw, stop)
        async with buf.lock:
            # Decoding (inside the Arrow sink) runs on a worker thread.
            await asyncio.to_thread(buf.sink.push, raw)
            decoded = buf.arrow.last if buf.arrow is not None else None
            result = buf.arrow.last_result if buf.arrow is not None else None
        if result is not None:
            for failure in result.failures:
                ctx.metrics.decode_failures.labels(key[0], failure.reason.value).inc()
        ctx.live.append(key[0], key[1], LiveEntry(first, last, raw, decoded))
        labels = self._labels(key)
        ctx.metrics.records.labels(*labels).inc(raw.num_rows)
        nbytes = int(
            raw.column(ctx.columns.value).nbytes + raw.column(ctx.columns.source("key")).nbytes
        )
        ctx.metrics.bytes.labels(*labels).inc(nbytes)
        ctx.metrics.consumed.labels(*labels).set(last + 1)
        ctx.stats.done("decode", raw.num_rows, nbytes, time.perf_counter() - started)
        return nbytes

    def _schedule(self, now: float) -> None:
        for key, buf in self._parts.items():
            if key not in self._flushes and buf.due(now, self.ctx.raw_cfg):
                self._flushes[key] = asyncio.create_task(self._flush(key, buf))
        total = sum(b.held_bytes for b in self._parts.values())
        self.ctx.metrics.buffered_bytes.set(total)
        waiting_write = waiting_commit = 0
        for (topic, partition), b in self._parts.items():
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

    async def _backpressure(self, stop: asyncio.Event) -> bool:
        """Pause fetching while more than ``max_buffered_bytes`` is not yet durable."""
        total = sum(b.held_bytes for b in self._parts.values())
        limit = self.ctx.raw_cfg.max_buffered_bytes
        if total < limit:
            if self._paused:
                self.source.resume(list(self._parts))
                self._paused = False
                self.ctx.metrics.paused.labels(self.cfg.name).set(0)
            return False
        if not self._paused:
            self.source.pause(list(self._parts))
            self._paused = True
            self.ctx.metrics.paused.labels(self.cfg.name).set(1)
        # Roll everything now, then wait for a write to finish.
        self._schedule(float("inf"))
        if self._flushes:
            await asyncio.wait(list(self._flushes.values()), return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(0.01)
        return True

    # -- durability ----------------------------------------------------------------

    async def _flush(self, key: PartitionKey, buf: PartitionBuffer) -> None:
        try:
            async with buf.lock:
                pending = buf.take()
            span = pending.span
            backoff = Backoff(RETRY_BASE_S, RETRY_MAX_S)
            while True:
                started = time.perf_counter()
                try:
                    with self.ctx.tracing.span(
                        "twg.write",
                        {"topic": key[0], "partition": key[1], "rows": pending.raw.num_rows},
                    ):
                        written = await asyncio.to_thread(
                            self.ctx.writer.write,
                            key[0],
                            key[1],
                            pending.raw,
                            pending.decoded,
                            span.covers_from,
                            span.covers_to,
                        )
                    break
                except LaneError as exc:
                    self.ctx.metrics.write_errors.labels(key[0]).inc()
                    self.ctx.health.set(RAW_LANE, State.DOWN, str(exc))
                    # The raw lane is the product: retried until it works (bounded
                    # delays, never given up), while /ready says it is down.
                    self.ctx.metrics.retries.labels("write").inc()
                    delay = await backoff.wait()
                    log.error("%s; retried in %.1fs", exc, delay)
            self.ctx.health.set(RAW_LANE, State.UP, "writing")
            m = self.ctx.metrics
            m.write_seconds.labels(key[0]).observe(time.perf_counter() - started)
            self.ctx.stats.done("write", written.rows, written.bytes, time.perf_counter() - started)
            m.raw_files.labels(key[0]).inc()
            m.raw_bytes.labels(key[0]).inc(written.bytes)
            m.raw_file_bytes.labels(key[0]).observe(written.bytes)
            m.raw_rows.labels(key[0]).inc(written.rows)
            if written.dlq_rows:
                m.dlq_records.labels(key[0]).inc(written.dlq_rows)
            if self._dlq_topic is not None and written.dead is not None:
                await self._send_dead_letters(written.dead)
            buf.in_flight_bytes -= pending.nbytes
            buf.in_flight_rows -= pending.raw.num_rows
            buf.durable = span.covers_to
            self.ctx.live.mark_durable(key[0], key[1], span.covers_to)
            m.durable.labels(*self._labels(key)).set(span.covers_to)
            await self._commit(buf)
        except Exception as exc:
            # The taken batches are gone from memory but not durable. Carrying on would let
            # a later segment commit past them, so the runner stops; a restart re-reads
            # them from the committed position.
            log.exception("flush of %s[%d] failed; stopping the source", key[0], key[1])
            self._fatal = exc
            self.ctx.health.set(RAW_LANE, State.DOWN, f"flush failed: {exc}")
            raise
        finally:
            self._flushes.pop(key, None)

    async def _commit(self, buf: PartitionBuffer) -> None:
        """Commit the durable end. Never anything beyond it."""
        durable = buf.durable
        if durable is None or durable == buf.committed:
            return
        key = (buf.topic, buf.partition)
        started = time.perf_counter()
        try:
            with self.ctx.tracing.span(
                "twg.commit", {"topic": key[0], "partition": key[1], "offset": durable}
            ):
                await self.source.commit({key: durable})
        except SourceError as exc:
            # Not fatal: the next segment's commit covers this one too, and on restart the
            # lane's coverage moves the position past what is durable.
            self.ctx.metrics.commit_errors.labels(self.cfg.name).inc()
            log.warning("%s (will commit with the next segment)", exc)
            return
        took = time.perf_counter() - started
        self.ctx.stats.done("commit", durable - (buf.committed or 0), 0, took)
        self.ctx.metrics.commit_seconds.labels(self.cfg.name).observe(took)
        buf.committed = durable
        self.ctx.live.mark_committed(buf.topic, buf.partition, durable)
        self.ctx.metrics.committed.labels(*self._labels(key)).set(durable)

    async def _flush_now(self, key: PartitionKey) -> None:
        """Make everything buffered for ``key`` durable and committed."""
        task = self._flushes.get(key)
        if task is not None:
            await task
        buf = self._parts.get(key)
        if buf is not None and not buf.sink.empty:
            self._flushes[key] = task = asyncio.create_task(self._flush(key, buf))
            await task
        elif buf is not None:
            await self._commit(buf)

    async def _drain(self) -> None:
        if self._fatal is not None:
            return  # never write or commit after a lost batch
        for key in list(self._parts):
            await self._flush_now(key)

    def _budget(self) -> Budget:
        """What the next poll may bring: the bytes left under the buffer bound, as
        records at the estimated p95 size."""
        held = sum(b.held_bytes for b in self._parts.values())
        free = self.ctx.raw_cfg.max_buffered_bytes - held
        budget = budget_for(free, self._sizes, self.cfg.max_poll_records, POLL_TIMEOUT_MS)
        self.ctx.metrics.budget_records.labels(self.cfg.name).set(budget.max_records)
        return budget

    async def _send_dead_letters(self, dead: pa.Table) -> None:
        """Produce dead letters to the DLQ topic before the commit (the commit waits: a
        letter is never behind the committed position), retried until done — or, with
        ``dlq_topic_max_wait_s``, until that bound: then the letters stay in the durable
        ``dlq/`` lane only, the give-up is counted, and the commit goes on."""
        assert self._dlq_topic is not None
        assert isinstance(self.cfg, KafkaSourceConfig)
        bound = self.cfg.dlq_topic_max_wait_s
        deadline = None if bound is None else time.monotonic() + bound
        backoff = Backoff(RETRY_BASE_S, RETRY_MAX_S)
        while True:
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                await asyncio.wait_for(self._dlq_topic.send(dead), left)
                return
            except (ThalwegError, TimeoutError) as exc:
                error = exc if str(exc) else f"no answer within {bound:g}s"
                if deadline is not None and time.monotonic() >= deadline:
                    self.ctx.metrics.retries_exhausted.labels("dlq").inc()
                    log.error(
                        "dead letters to %s: %s; gave up after dlq_topic_max_wait_s = %gs, "
                        "the %d letter(s) are in the dlq/ lane only",
                        self._dlq_topic.topic,
                        error,
                        bound,
                        dead.num_rows,
                    )
                    await self._dlq_topic.stop()  # a fresh producer for the next letters
                    return
                self.ctx.metrics.retries.labels("dlq").inc()
                delay = await backoff.wait()
                log.error(
                    "dead letters to %s: %s; retried in %.1fs", self._dlq_topic.topic, error, delay
                )

    async def _watch_broker(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PROBE_EVERY_S)
            if not stop.is_set():
                await self._probe_broker()

    async def _probe_broker(self) -> None:
        """Mark the source down while no broker answers, and up again once one does."""
        ok = await self.source.probe()
        if not ok and not self._broker_down:
            self._broker_down = True
            self.ctx.health.set(self.component, State.DOWN, "no broker answers")
            log.error("source %s: no broker answers; fetching resumes when one does", self.cfg.name)
        elif ok and self._broker_down:
            self._broker_down = False
            self.ctx.health.set(self.component, State.UP, "connected")
            log.warning("source %s: brokers answer again", self.cfg.name)

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

    def _labels(self, key: PartitionKey) -> tuple[str, str, str]:
        return (self.cfg.name, key[0], str(key[1]))
