"""The commit protocol: buffered records → durable segment → committed position.

This is the invariant the product rests on, in one place for every source: a
partition's position is committed only to the exclusive end of segments whose rename
(and directory fsync) has returned — never beyond, never backwards within an epoch,
never for a partition held because its log diverged, never while ownership is in doubt.
A raw-lane write that fails is retried until it works (the raw lane is the product); a
batch lost from memory without being durable stops the source (a restart reads it
again from the committed position); a segment that would overwrite or overlap another
stops it loudly.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

import pyarrow as pa

from thalweg.engine.context import RAW_LANE, SourceState, new_backoff
from thalweg.engine.ingest.buffer import PartitionBuffer, Pending
from thalweg.errors import InvariantError, LaneError, OwnershipLostError, SourceError, ThalwegError
from thalweg.lane.layout import Segment
from thalweg.lane.writer import WrittenSegment
from thalweg.ops.health import State
from thalweg.ops.retry import Backoff
from thalweg.sources.base import DeadLetterOutlet, PartitionKey

log = logging.getLogger(__name__)


WRITES_IN_FLIGHT = 2


def _unfenced() -> None:
    """No ownership to lose (a source without group sessions)."""


class Checkpoint:
    """Flushes, writes and commits the partitions of one source."""

    def __init__(self, state: SourceState, dlq_topic: DeadLetterOutlet | None) -> None:
        self.s = state
        self._dlq_topic = dlq_topic
        self.flushes: dict[PartitionKey, asyncio.Task[None]] = {}
        # Segment writes in flight at once. When every partition rolls together (32
        # segments), unbounded writes filled the thread pool and each held the GIL in
        # turn: the fetch loop and the follow streams waited seconds. Two keep both
        # cores writing (Parquet encodes without the GIL) and the loop responsive.
        self._writing = asyncio.Semaphore(WRITES_IN_FLIGHT)
        # Called with a segment made durable without its decoded twin (a failed write of
        # it): the runner rebuilds the twin while it runs (engine/ingest/rebuilds.py).
        self.on_decoded_missing: Callable[[PartitionKey, Segment], None] | None = None

    def start_due(self, now: float) -> None:
        """Start a flush for every partition whose buffer is due (``inf``: all)."""
        for key, buf in self.s.parts.items():
            if key not in self.flushes and buf.due(now, self.s.ctx.raw_cfg):
                self.flushes[key] = asyncio.create_task(self.flush(key, buf, now))

    async def wait_any(self) -> None:
        """Until one flush in flight finishes (a moment when none is)."""
        if self.flushes:
            await asyncio.wait(list(self.flushes.values()), return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(0.01)

    async def flush(self, key: PartitionKey, buf: PartitionBuffer, now: float) -> None:
        """Write what ``buf`` holds as segments of at most the roll limits, committing
        the end of each as it lands (``now``: what is due, ``PartitionBuffer.take``)."""
        s, ctx = self.s, self.s.ctx
        pending: Pending | None = None
        try:
            while True:
                pending = buf.take(ctx.raw_cfg, now)
                await self._land(key, buf, pending)
                pending = None
                if s.fatal is not None or s.in_doubt or s.parts.get(key) is not buf:
                    break  # stopped, or the buffer is being dropped: write no more of it
                if not (buf.rest or (now == math.inf and not buf.empty)):
                    break  # the rest is not due (``inf``: everything was asked for)
        except OwnershipLostError as exc:
            # Not written, and the fence doubts ownership now. The segment goes back to
            # the front of the buffer: should the doubt clear, it is written next (taken
            # out, a later segment would commit past it); should ownership be lost, the
            # loop drops the buffer and rewinds (and the drop counts what it dropped).
            log.warning("%s[%d]: %s", key[0], key[1], exc)
            if pending is not None and s.parts.get(key) is buf:
                buf.in_flight_bytes -= pending.nbytes
                buf.in_flight_rows -= pending.rows
                buf.rest.appendleft(pending)
        except Exception as exc:
            # The taken batches are gone from memory but not durable. Carrying on would let
            # a later segment commit past them, so the source stops; a restart re-reads
            # them from the committed position. A segment conflict (another writer of the
            # lane) ends here too: refused loudly, never written beside.
            log.exception("flush of %s[%d] failed; stopping the source", key[0], key[1])
            s.fatal = exc
            ctx.health.set(RAW_LANE, State.DOWN, f"flush failed: {exc}")
            raise
        finally:
            self.flushes.pop(key, None)

    async def _land(self, key: PartitionKey, buf: PartitionBuffer, pending: Pending) -> None:
        """Write one segment and everything that goes with it, then commit its end."""
        s, ctx = self.s, self.s.ctx
        span = pending.span
        written, started = await self._write(key, buf, pending)
        if not written.decoded_ok and self.on_decoded_missing is not None:
            self.on_decoded_missing(key, written.segment)
        if ctx.mirror is not None:
            await self._publish(key, written)
        self._account(key, written, started)
        if self._dlq_topic is not None and written.dead is not None:
            await self._send_dead_letters(written.dead)
        buf.in_flight_bytes -= pending.nbytes
        buf.in_flight_rows -= pending.rows
        buf.durable = span.covers_to
        ctx.live.mark_durable(key[0], key[1], span.covers_to)
        ctx.metrics.durable.labels(*s.labels(key)).set(span.covers_to)
        await self.commit(buf)

    async def _write(
        self, key: PartitionKey, buf: PartitionBuffer, pending: Pending
    ) -> tuple[WrittenSegment, float]:
        """The segment made durable, and when its successful attempt started.

        A retriable lane failure is retried until it works (the raw lane is the product:
        bounded delays, never given up) while /ready says the lane is down.

        Raises:
            OwnershipLostError: ownership is in doubt, or ``buf`` was dropped (a doubt
                came and went) before the segment's rename: the buffer that replaced it
                reads these records again from the durable end, so they must not land
                from here (a soak run of the DAG crash test found such a write, queued
                for a write slot across a doubt, landing twice: a segment conflict).
        """
        s, ctx = self.s, self.s.ctx
        group = s.fence.check if s.fence is not None else _unfenced

        def fence() -> None:
            group()
            if s.parts.get(key) is not buf:
                raise OwnershipLostError(
                    f"{key[0]}[{key[1]}]: its buffer was dropped while the segment waited "
                    "to be written; not written (the partition reads it again)"
                )

        span = pending.span
        backoff = new_backoff()
        while True:
            started = time.perf_counter()
            try:
                with ctx.tracing.span(
                    "twg.write",
                    {"topic": key[0], "partition": key[1], "rows": pending.raw.num_rows},
                ):
                    async with self._writing:
                        fence()  # the wait for a slot may have outlived the buffer
                        written = await asyncio.to_thread(
                            ctx.writer.write,
                            key[0],
                            key[1],
                            pending.raw,
                            pending.decoded,
                            span.covers_from,
                            span.covers_to,
                            fence,
                            pending.failures if pending.decoded is not None else None,
                        )
                ctx.health.set(RAW_LANE, State.UP, "writing")
                return written, started
            except LaneError as exc:
                if not exc.retriable:
                    raise
                await self._lane_down(key, exc, "write", backoff)

    async def _publish(self, key: PartitionKey, written: WrittenSegment) -> None:
        """PUT the segment to the object store (lane/remote/mirror.py): it is durable — and its
        positions committable — only then. Retried like a local write; the fence is asked
        before every PUT and after the last.

        A member whose ownership is in doubt commits nothing anyway; what matters is
        whether the segment is in the store. If its raw object landed (a member that
        froze during the PUT), the segment is durable there under this member's
        generation — the next owner's newer generation supersedes it where they overlap
        — and it is not written again. If it did not, the local files are removed so the
        records are fetched and written again, by whichever member owns them.

        Raises:
            OwnershipLostError: in doubt, and the raw object is not in the store.
        """
        s, ctx = self.s, self.s.ctx
        mirror = ctx.mirror
        if mirror is None:
            raise InvariantError("mirror is not set")
        fence = s.fence.check if s.fence is not None else _unfenced
        name, generation = written.segment.path.name, s.source.generation()
        backoff = new_backoff()
        while True:
            try:
                with ctx.tracing.span("twg.publish", {"topic": key[0], "partition": key[1]}):
                    await asyncio.to_thread(mirror.publish, key[0], key[1], name, generation, fence)
                fence()
                ctx.health.set(RAW_LANE, State.UP, "writing")
                return
            except OwnershipLostError:
                if await self._landed(key, name, generation):
                    ctx.metrics.fenced.labels(*s.labels(key)).inc(written.rows)
                    log.warning(
                        "%s[%d]: %s reached the object store while ownership was in doubt; "
                        "not committed from here",
                        *key,
                        name,
                    )
                    return
                await asyncio.to_thread(mirror.discard_local, key[0], key[1], name)
                raise
            except LaneError as exc:
                if not exc.retriable:
                    raise
                await self._lane_down(key, exc, "publish", backoff)

    async def _lane_down(
        self, key: PartitionKey, exc: LaneError, stage: str, backoff: Backoff
    ) -> None:
        """A retriable lane failure: counted, /ready down, then wait before the retry."""
        ctx = self.s.ctx
        ctx.metrics.write_errors.labels(key[0]).inc()
        ctx.health.set(RAW_LANE, State.DOWN, str(exc))
        ctx.metrics.retries.labels(stage).inc()
        delay = await backoff.wait()
        log.error("%s; retried in %.1fs", exc, delay)

    async def _landed(self, key: PartitionKey, name: str, generation: int) -> bool:
        """Whether the segment's raw object is in the store, asked until it answers."""
        mirror = self.s.ctx.mirror
        if mirror is None:
            raise InvariantError("mirror is not set")
        backoff = new_backoff()
        while True:
            try:
                return await asyncio.to_thread(mirror.landed, key[0], key[1], name, generation)
            except LaneError as exc:
                delay = await backoff.wait()
                log.error("%s; asked again in %.1fs", exc, delay)

    def _account(self, key: PartitionKey, written: WrittenSegment, started: float) -> None:
        ctx, m = self.s.ctx, self.s.ctx.metrics
        took = time.perf_counter() - started
        m.write_seconds.labels(key[0]).observe(took)
        ctx.stats.done("write", written.rows, written.bytes, took)
        m.raw_files.labels(key[0]).inc()
        m.raw_bytes.labels(key[0]).inc(written.bytes)
        m.raw_file_bytes.labels(key[0]).observe(written.bytes)
        m.raw_rows.labels(key[0]).inc(written.rows)
        if written.dlq_rows:
            m.dlq_records.labels(key[0]).inc(written.dlq_rows)

    async def commit(self, buf: PartitionBuffer) -> None:
        """Commit the durable end. Never anything beyond it."""
        s, ctx = self.s, self.s.ctx
        durable = buf.durable
        if durable is None or durable == buf.committed:
            return
        key = (buf.topic, buf.partition)
        if key in s.held or s.in_doubt:
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
            with ctx.tracing.span(
                "twg.commit", {"topic": key[0], "partition": key[1], "offset": durable}
            ):
                await s.source.commit({key: durable})
        except SourceError as exc:
            # Not fatal: the next segment's commit covers this one too, and on restart the
            # lane's coverage moves the position past what is durable.
            ctx.metrics.commit_errors.labels(s.cfg.name).inc()
            log.warning("%s (will commit with the next segment)", exc)
            if s.fence is not None and not s.fence.membership_ok():
                s.fence.doubt(f"a commit was refused: {exc}")
            return
        took = time.perf_counter() - started
        ctx.stats.done("commit", durable - (buf.committed or 0), 0, took)
        ctx.metrics.commit_seconds.labels(s.cfg.name).observe(took)
        buf.committed = durable
        ctx.live.mark_committed(buf.topic, buf.partition, durable)
        ctx.metrics.committed.labels(*s.labels(key)).set(durable)

    async def flush_now(self, key: PartitionKey) -> None:
        """Make everything buffered for ``key`` durable and committed."""
        # One flush of a partition at a time: the loop may start another while this
        # waits for one (its segments would land out of order).
        while (task := self.flushes.get(key)) is not None:
            await task
        buf = self.s.parts.get(key)
        if buf is None:
            return
        if buf.empty:
            await self.commit(buf)
        else:
            self.flushes[key] = task = asyncio.create_task(self.flush(key, buf, math.inf))
            await task

    async def drain(self) -> None:
        """Flush and commit every partition (a stop); nothing after a lost batch, and
        nothing while ownership is in doubt."""
        s = self.s
        if s.fatal is not None:
            return
        if s.fence is not None and s.fence.in_doubt and not s.fence.try_clear():
            log.warning("stopping with ownership in doubt: buffered records are not written")
            return
        for key in list(s.parts):
            await self.flush_now(key)

    async def stop(self) -> None:
        if self._dlq_topic is not None:
            await self._dlq_topic.stop()

    async def _send_dead_letters(self, dead: pa.Table) -> None:
        """Produce dead letters to the DLQ topic before the commit (the commit waits: a
        letter is never behind the committed position), retried until done — or, with
        ``dlq_topic_max_wait_s``, until that bound: then the letters stay in the durable
        ``dlq/`` lane only, the give-up is counted, and the commit goes on."""
        dlq = self._dlq_topic
        if dlq is None:
            raise InvariantError("dlq is not set")
        bound = self.s.features.dead_letters_max_wait_s
        deadline = None if bound is None else time.monotonic() + bound
        backoff = new_backoff()
        while True:
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                await asyncio.wait_for(dlq.send(dead), left)
                return
            except (ThalwegError, TimeoutError) as exc:
                error = exc if str(exc) else f"no answer within {bound:g}s"
                if deadline is not None and time.monotonic() >= deadline:
                    self.s.ctx.metrics.retries_exhausted.labels("dlq").inc()
                    log.error(
                        "dead letters to %s: %s; gave up after dlq_topic_max_wait_s = %gs, "
                        "the %d letter(s) are in the dlq/ lane only",
                        dlq.topic,
                        error,
                        bound,
                        dead.num_rows,
                    )
                    await dlq.stop()  # a fresh producer for the next letters
                    return
                self.s.ctx.metrics.retries.labels("dlq").inc()
                delay = await backoff.wait()
                log.error("dead letters to %s: %s; retried in %.1fs", dlq.topic, error, delay)
