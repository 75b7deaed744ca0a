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
import pyarrow.compute as pc
import pyarrow.parquet as pq

from thalweg.codecs.lane import decode_batch
from thalweg.config.models import KafkaSourceConfig, PulsarSourceConfig, RawLaneConfig
from thalweg.engine.budget import Budget, SizeEstimator, budget_for
from thalweg.engine.buffer import PartitionBuffer
from thalweg.engine.continuity import (
    LastRecord,
    check_record,
    check_start,
    last_record,
    log_shrank,
    offset_went_back,
    record_mismatch,
)
from thalweg.engine.decoders import TopicDecoders
from thalweg.engine.fence import OwnershipFence
from thalweg.engine.retry import Backoff
from thalweg.engine.throttle import Throttle
from thalweg.errors import LaneError, OwnershipLostError, SourceError, ThalwegError
from thalweg.lane.coverage import repair, resume_position, scan_coverage
from thalweg.lane.epochs import (
    Divergence,
    close_epoch,
    current_epoch,
    mark_diverged,
    read_divergence,
)
from thalweg.lane.layout import LaneLayout, Segment
from thalweg.lane.live import LiveEntry, LiveTail
from thalweg.lane.writer import SegmentWriter
from thalweg.ops.health import Health, State
from thalweg.ops.metrics import Metrics
from thalweg.ops.stats import PipelineStats
from thalweg.ops.tracing import Tracing, links_from_headers
from thalweg.records.columns import MetadataColumns
from thalweg.records.record_id import with_epoch_ids
from thalweg.sinks.dlq_topic import DeadLetterTopic
from thalweg.sources import load_source_class
from thalweg.sources.base import PartitionKey, Source
from thalweg.sources.kafka_security import security_kwargs

log = logging.getLogger(__name__)


def _unfenced() -> None:
    """No ownership to lose (a source without group sessions)."""


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
        # Log continuity (Kafka): per partition, its epoch, the next offset expected
        # from a fetch, a pending check of the lane's last record, and the partitions
        # held because their broker log no longer continues the lane.
        self._epochs: dict[PartitionKey, int] = {}
        self._next: dict[PartitionKey, int] = {}
        self._verify: dict[PartitionKey, LastRecord] = {}
        self._held: dict[PartitionKey, Divergence] = {}
        self._doubting = False
        self._missing_since: float | None = None
        self._topics_registered = False
        self._first_fetched: dict[PartitionKey, int] = {}
        self._fence = (
            OwnershipFence.for_session(
                cfg.session_timeout_ms, cfg.heartbeat_interval_ms, self.source.membership
            )
            if isinstance(cfg, KafkaSourceConfig)
            else None
        )
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
        fence_stop = asyncio.Event()
        fencer = (
            asyncio.create_task(self._fence.run(fence_stop)) if self._fence is not None else None
        )
        try:
            while not stop.is_set():
                if self._fatal is not None:
                    raise self._fatal
                self.ctx.health.beat()
                if await self._fenced(stop):
                    continue
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
            fence_stop.set()
            if fencer is not None:
                await asyncio.gather(fencer, return_exceptions=True)
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
            if self._fence is not None and not self._fence.membership_ok():
                self._fence.doubt("revoked after the group forgot this member")
            doubt = self._fence is not None and self._fence.in_doubt
            for key in keys:
                if doubt:
                    # Another member may own it already: whatever is buffered is left for
                    # it to read again (nothing of it was committed).
                    self._drop(key, "revoked while ownership is in doubt")
                else:
                    await self._flush_now(key)
                self._forget(key)
            self._report_assignment()
        except Exception as exc:
            self._fatal = exc
            raise

    def _forget(self, key: PartitionKey) -> None:
        self._parts.pop(key, None)
        self._next.pop(key, None)
        self._verify.pop(key, None)
        self._held.pop(key, None)
        self._epochs.pop(key, None)
        self._first_fetched.pop(key, None)

    def _drop(self, key: PartitionKey, why: str) -> None:
        """Forget what ``key`` buffered (never written, never committed)."""
        buf = self._parts.get(key)
        if buf is None:
            return
        if buf.held_rows:
            log.warning("%s[%d]: dropped %d buffered records: %s", *key, buf.held_rows, why)
        self._parts[key] = self._new_buffer(key, buf.durable, buf.committed)
        rewind = buf.durable if buf.durable is not None else self._first_fetched.get(key)
        self.ctx.live.reset(key[0], key[1], rewind)
        if rewind is not None:
            # Should the partition still be ours, it is read again from there.
            self.source.seek(key, rewind)
            self._next[key] = rewind

    async def _assign(self, keys: list[PartitionKey]) -> None:
        # aiokafka keeps fetching while this callback awaits. Until a partition's resume
        # position is known and its buffer exists, records fetched for it would have
        # nowhere to go, so the partitions stay paused until then (synchronously, before
        # the first await).
        self.source.pause(keys)
        if self._fence is not None:
            self._fence.confirm("partitions assigned")
        ready = [key for key in keys if await self._assign_one(key)]
        self._report_assignment()
        if not self._paused:
            self.source.resume(ready)

    async def _assign_one(self, key: PartitionKey) -> bool:
        """Set a partition up to be consumed; False when it is held (diverged)."""
        topic, partition = key
        layout = self.ctx.layout
        marker = await asyncio.to_thread(read_divergence, layout, topic, partition)
        if marker is not None:
            if not self._new_epoch_on_divergence():
                await self._hold(key, marker, persist=False)
                return False
            await asyncio.to_thread(close_epoch, layout, topic, partition)
            self._release(key)
        epoch = await asyncio.to_thread(current_epoch, layout, topic, partition)
        self._epochs[key] = epoch
        missing = await asyncio.to_thread(repair, layout, topic, partition)
        if missing:
            await asyncio.to_thread(self._redecode, topic, partition, missing)
        cov = await asyncio.to_thread(scan_coverage, layout, topic, partition)
        committed = await self.source.committed(key)
        log_start = await self._log_start(key)
        seek_to = resume = resume_position(cov, committed)
        if epoch > 0 and cov.end is None:
            # A new epoch starts with the broker's log; what the group committed belongs
            # to the closed one.
            seek_to = resume = log_start if log_start is not None else 0
            committed = None
        elif self.source.positions_are_offsets and cov.end is not None and resume == cov.end:
            # (Resuming past the lane's end — the group committed what another member's
            # lane holds — leaves nothing of this lane to compare at the resume point.)
            if log_start is not None:
                div = check_start(topic, partition, epoch, cov.end, log_start)
                if div is not None:
                    await self._hold(key, div)
                    return False
            last = await asyncio.to_thread(
                last_record, layout, self.ctx.columns, topic, partition, resume
            )
            if last is not None and (log_start is None or last.offset >= log_start):
                # Fetch the lane's last record once more and compare it (_verified).
                self._verify[key] = last
                seek_to = last.offset
        if seek_to is not None:
            self.source.seek(key, seek_to)
        if resume is not None:
            self._next[key] = resume
        buf = self._new_buffer(key, resume, committed)
        self._parts[key] = buf
        self.ctx.live.reset(topic, partition, resume)
        labels = self._labels(key)
        self.ctx.metrics.diverged.labels(*labels).set(0)
        if resume is not None:
            self.ctx.metrics.durable.labels(*labels).set(resume)
            self.ctx.metrics.consumed.labels(*labels).set(resume)
        if committed is not None:
            self.ctx.metrics.committed.labels(*labels).set(committed)
        caught_up = resume is not None and (committed is None or resume > committed)
        if caught_up and key not in self._verify:
            # The lane already holds these records durably: catch the group up.
            await self._commit(buf)
        log.info(
            "assigned %s[%d]: epoch=%d committed=%s lane_end=%s resume=%s log_start=%s",
            topic,
            partition,
            epoch,
            committed,
            cov.end,
            resume,
            log_start,
        )
        return True

    def _new_buffer(
        self, key: PartitionKey, durable: int | None, committed: int | None
    ) -> PartitionBuffer:
        return PartitionBuffer.create(
            key[0],
            key[1],
            durable=durable,
            committed=committed,
            columns=self.ctx.columns,
            decoder=self.decoders.for_topic(key[0]),
        )

    def _new_epoch_on_divergence(self) -> bool:
        return isinstance(self.cfg, KafkaSourceConfig) and self.cfg.on_divergence == "new_epoch"

    async def _log_start(self, key: PartitionKey) -> int | None:
        if not self.source.positions_are_offsets:
            return None
        try:
            return await self.source.log_start(key)
        except SourceError as exc:
            # The record check and the fetch check still run; they need no bounds.
            log.warning("%s[%d]: log start unknown (%s); checked on fetch instead", *key, exc)
            return None

    # -- log continuity ------------------------------------------------------------

    async def _hold(self, key: PartitionKey, div: Divergence, *, persist: bool = True) -> None:
        """Stop a partition whose broker log no longer continues its lane."""
        self.source.pause([key])
        self._held[key] = div
        if persist:
            await asyncio.to_thread(mark_diverged, self.ctx.layout, div)
        log.error("%s", div.describe())
        labels = self._labels(key)
        self.ctx.metrics.diverged.labels(*labels).set(1)
        name = self._partition_component(key)
        self.ctx.health.register(name, "partition", gates_readiness=True)
        self.ctx.health.set(name, State.DOWN, div.describe(), info=div.info())
        if persist and self._new_epoch_on_divergence():
            await self._reopen(key)

    def _release(self, key: PartitionKey) -> None:
        """A held partition is going again: clear its health entry and gauge."""
        self._held.pop(key, None)
        self.ctx.health.remove(self._partition_component(key))
        self.ctx.metrics.diverged.labels(*self._labels(key)).set(0)

    async def _reopen(self, key: PartitionKey) -> None:
        """Start a held partition again (its epoch was closed, or is about to be)."""
        self._release(key)
        self._forget(key)
        if await self._assign_one(key):
            self._report_assignment()
            if not self._paused:
                self.source.resume([key])

    async def _check_held(self) -> None:
        """Pick up partitions whose divergence an operator resolved while held
        (``twg lane new-epoch`` closed the epoch: the marker is gone)."""
        for key in list(self._held):
            marker = await asyncio.to_thread(read_divergence, self.ctx.layout, *key)
            if marker is None and key in self._held:
                log.warning("%s[%d]: divergence resolved by the operator; resuming", *key)
                await self._reopen(key)

    async def _diverge(self, key: PartitionKey, div: Divergence) -> None:
        """Hold a partition found diverged while running: what it buffered before (read
        from the old log, which the broker no longer has) is made durable, never
        committed."""
        self._held[key] = div
        self.source.pause([key])
        await self._flush_now(key)
        self._forget(key)
        await self._hold(key, div)

    async def _verified(
        self, key: PartitionKey, raw: pa.RecordBatch, expected: LastRecord
    ) -> pa.RecordBatch | None:
        """Compare the first fetch after an assignment with the lane's last record; the
        part of ``raw`` that is new (None when nothing is, or the log diverged)."""
        c = self.ctx.columns
        del self._verify[key]
        epoch = self._epochs.get(key, 0)
        positions = raw.column(c.position)
        first = int(positions[0].as_py())
        if first < expected.offset:
            await self._diverge(key, offset_went_back(*key, epoch, first, expected.offset, None))
            return None
        if not check_record(expected, raw, c):
            hw = self.source.highwater(key)
            await self._diverge(key, record_mismatch(*key, epoch, expected, hw))
            return None
        buf = self._parts.get(key)
        if buf is not None and buf.durable is not None and buf.durable != buf.committed:
            await self._commit(buf)  # deferred from the assignment until verified
        fresh = raw.filter(pc.greater_equal(positions, expected.resume))
        return fresh if fresh.num_rows else None

    def _partition_component(self, key: PartitionKey) -> str:
        return f"partition:{self.cfg.name}:{key[0]}[{key[1]}]"

    def _report_assignment(self) -> None:
        held = sorted(f"{t}[{p}]" for t, p in self._parts)
        group = self.cfg.group_id if isinstance(self.cfg, KafkaSourceConfig) else None
        note = (
            f"holds {len(held)} partition(s)"
            if held
            else "holds no partition: the group's other members hold them all"
            if group
            else "holds no partition yet"
        )
        self.ctx.health.annotate(
            self.component,
            partitions=held,
            held_diverged=sorted(f"{t}[{p}]" for t, p in self._held),
            assignment=note,
        )

    def _redecode(self, topic: str, partition: int, segments: list[Segment]) -> None:
        """Rebuild decoded segments that a failed decoded write left missing."""
        decoder = self.decoders.get(topic)
        if decoder is None:
            return
        for seg in segments:
            path = seg.path
            raw = pq.read_table(path).replace_schema_metadata(None)
            meta = None
            decoded = pa.concat_tables(
                [decode_batch(decoder, b, self.ctx.columns)[0] for b in raw.to_batches()],
                promote_options="permissive",
            )
            del meta
            self.ctx.writer.write_decoded(topic, partition, seg, decoded)

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
        checked = await self._continuity(key, raw)
        if checked is None:
            return 0
        raw = checked
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

    async def _continuity(self, key: PartitionKey, raw: pa.RecordBatch) -> pa.RecordBatch | None:
        """``raw`` once the log is known to continue the lane, with this epoch's record
        ids; None when nothing of it is to be ingested."""
        if not self.source.positions_are_offsets:
            return raw
        expected = self._verify.get(key)
        if expected is not None:
            checked = await self._verified(key, raw, expected)
            if checked is None:
                return None
            raw = checked
        positions = raw.column(self.ctx.columns.position)
        first = int(positions[0].as_py())
        self._first_fetched.setdefault(key, first)
        want = self._next.get(key)
        if want is not None and first < want:
            epoch = self._epochs.get(key, 0)
            await self._diverge(
                key, offset_went_back(*key, epoch, first, want, self.source.highwater(key))
            )
            return None
        self._next[key] = int(positions[-1].as_py()) + 1
        epoch = self._epochs.get(key, 0)
        if epoch:
            raw = with_epoch_ids(raw, self.ctx.columns, self.cfg.cluster_name, *key, epoch)
        return raw

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

    async def _fenced(self, stop: asyncio.Event) -> bool:
        """While ownership is in doubt: drop every buffer, rewind and pause the
        partitions, and wait for evidence (True: skip this turn of the loop)."""
        f = self._fence
        if f is None:
            return False
        if f.in_doubt and not f.try_clear():
            if not self._doubting:
                self._doubting = True
                keys = list(self._parts)
                self.source.pause(keys)
                for key in keys:
                    self._drop(key, f"ownership in doubt ({f.reason})")
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
            if not self._paused:
                self.source.resume([k for k in self._parts if k not in self._held])
            self.ctx.health.set(self.component, State.UP, "connected")
        return False

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
                            self._fence.check if self._fence is not None else _unfenced,
                        )
                    break
                except LaneError as exc:
                    if not exc.retriable:
                        raise
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
        except OwnershipLostError as exc:
            # Not written, and the fence doubts ownership now: the loop drops what the
            # partition buffered and rewinds it (_fenced); another owner reads it anyway.
            log.warning("%s[%d]: %s", key[0], key[1], exc)
        except Exception as exc:
            # The taken batches are gone from memory but not durable. Carrying on would let
            # a later segment commit past them, so the runner stops; a restart re-reads
            # them from the committed position. A segment conflict (another writer of the
            # lane) ends here too: refused loudly, never written beside.
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
        if key in self._held or (self._fence is not None and self._fence.in_doubt):
            return  # a diverged log, or perhaps another member's partition by now
        if buf.committed is not None and durable < buf.committed:
            # Within an epoch positions only grow; a lower durable end means the lane and
            # the group disagree, and committing it would move the group backwards.
            log.error(
                "%s[%d]: not committing %d below the committed %d", *key, durable, buf.committed
            )
            return
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
            if self._fence is not None and not self._fence.membership_ok():
                self._fence.doubt(f"a commit was refused: {exc}")
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
        if self._fence is not None and self._fence.in_doubt and not self._fence.try_clear():
            log.warning("stopping with ownership in doubt: buffered records are not written")
            return
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
                await self._check_held()
                await self._check_topics()
                await self._check_log_ends()

    async def _check_log_ends(self) -> None:
        """Hold partitions whose broker log now ends below what was already ingested
        (the broker lost data, or a recreated topic is shorter than the lane). On
        brokers that report the old position out of range the fetch check sees it
        first; others (tansu) simply wait at the old position, so the log end from the
        last fetch response is compared here."""
        if not self.source.positions_are_offsets or self._broker_down:
            return
        for key in list(self._parts):
            want = self._next.get(key)
            end = self.source.highwater(key)
            if want is None or end is None or end >= want or key in self._held:
                continue
            await self._diverge(key, log_shrank(*key, self._epochs.get(key, 0), want, end))

    async def _check_topics(self) -> None:
        """Say in /health which configured topics the broker does not have; past
        ``missing_topic_grace_s`` they gate readiness (a typo or a deleted topic would
        otherwise look like a quiet topic)."""
        if not isinstance(self.cfg, KafkaSourceConfig) or self._broker_down:
            return
        try:
            missing = await self.source.missing_topics()
        except SourceError as exc:
            log.debug("topic check skipped: %s", exc)
            return
        name = f"topics:{self.cfg.name}"
        now = time.monotonic()
        if not missing:
            self._missing_since = None
            if self._topics_registered:
                self.ctx.health.set(name, State.UP, "every configured topic exists")
            return
        if self._missing_since is None:
            self._missing_since = now
            log.warning("source %s: topics not on the broker: %s", self.cfg.name, missing)
        if now - self._missing_since < self.cfg.missing_topic_grace_s:
            return
        if not self._topics_registered:
            self.ctx.health.register(name, "topics", gates_readiness=True)
            self._topics_registered = True
        detail = f"configured topic(s) not on the broker: {', '.join(missing)}"
        if self.ctx.health.state(name) is not State.DOWN:
            log.error("source %s: %s", self.cfg.name, detail)
        self.ctx.health.set(name, State.DOWN, detail, info={"missing_topics": missing})

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
