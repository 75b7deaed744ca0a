"""The partitions a source holds: where each resumes, and whether its broker log still
continues its lane.

On assignment a partition is repaired, its coverage read, its epoch known, its resume
point chosen (the lane wins over a lagging commit) and — for Kafka — the log checked
(``engine/ingest/continuity.py``): a log that starts past the lane's end, or whose record at
the lane's last offset is another record, holds the partition. Every fetched batch is
admitted here first: an offset below one already ingested holds it too, and records of
an epoch above 0 get that epoch's ids. A held partition is paused, marked durably and
named in /health until its epoch is closed (``on_divergence`` or ``twg lane
new-epoch``); then it starts again, empty, at the broker's log start.

Its length: assignment, resume and log-continuity checks share the per-partition
state kept here (the checks themselves are ``continuity``'s).
"""

from __future__ import annotations

import asyncio
import logging

import pyarrow as pa
import pyarrow.compute as pc

from thalweg.engine.context import SourceState, new_backoff
from thalweg.engine.ingest.buffer import PartitionBuffer, roll_phase
from thalweg.engine.ingest.checkpoint import Checkpoint
from thalweg.engine.ingest.continuity import (
    LastRecord,
    check_record,
    check_start,
    last_record,
    log_shrank,
    offset_went_back,
    record_mismatch,
)
from thalweg.errors import InvariantError, LaneError, SourceError
from thalweg.lane.coverage import Coverage, repair, resume_position, scan_coverage
from thalweg.lane.epochs import (
    Divergence,
    close_epoch,
    current_epoch,
    mark_diverged,
    read_divergence,
)
from thalweg.lane.layout import Segment
from thalweg.lane.read.elsewhere import record_elsewhere
from thalweg.ops.health import State
from thalweg.pipeline.decoders import TopicDecoders
from thalweg.pipeline.redecode import redecode
from thalweg.records.record_id import with_epoch_ids
from thalweg.sources.base import PartitionKey

log = logging.getLogger(__name__)


class Partitions:
    """Assignment, resume points and log continuity of one source's partitions."""

    def __init__(self, state: SourceState, checkpoint: Checkpoint, decoders: TopicDecoders):
        self.s = state
        self._checkpoint = checkpoint
        self._decoders = decoders
        # Per partition: its epoch, the next offset expected from a fetch, a pending
        # check of the lane's last record, and the first offset fetched (to rewind to).
        self._epochs: dict[PartitionKey, int] = {}
        self._next: dict[PartitionKey, int] = {}
        self._verify: dict[PartitionKey, LastRecord] = {}
        self._first_fetched: dict[PartitionKey, int] = {}

    # -- assignment ----------------------------------------------------------------

    async def assigned(self, keys: list[PartitionKey]) -> None:
        s = self.s
        # aiokafka keeps fetching while this callback awaits. Until a partition's resume
        # position is known and its buffer exists, records fetched for it would have
        # nowhere to go, so the partitions stay paused until then (synchronously, before
        # the first await).
        s.source.pause(keys)
        if s.fence is not None:
            s.fence.confirm("partitions assigned")
        ready = [key for key in keys if await self.assign_one(key)]
        self.report()
        if not s.paused:
            s.source.resume(ready)

    async def revoked(self, keys: list[PartitionKey]) -> None:
        """Flush and let go of ``keys``. Every one of them is let go, even when a flush
        fails: a revoked partition left behind would be flushed later, beside its new
        owner's segments (soak, session 26: a conflict on one partition stopped the
        revoke, and the next one's buffer landed a second later as another writer's)."""
        s = self.s
        if s.fence is not None and not s.fence.membership_ok():
            s.fence.doubt("revoked after the group forgot this member")
        failed: Exception | None = None
        for key in keys:
            if s.in_doubt or failed is not None:
                # Another member may own it already: whatever is buffered is left for it
                # to read again (nothing of it was committed).
                self.drop(key, "revoked while ownership is in doubt")
            else:
                try:
                    await self._checkpoint.flush_now(key)
                except Exception as exc:
                    failed = exc
                    if s.fence is not None:
                        # A flush of this partition still in flight must not land either.
                        s.fence.doubt(f"a revoked partition's flush failed: {exc}")
            self.forget(key)
            s.ctx.live.forget(*key)
        self.report()
        if failed is not None:
            raise failed

    async def _publish_twins(self, key: PartitionKey, rebuilt: list[Segment]) -> None:
        """On a bucket lane, PUT the twins start-up rebuilt beside their raw objects (one
        the store refuses now is tried again at the partition's next assignment)."""
        mirror = self.s.ctx.mirror
        if mirror is None:
            return
        for seg in rebuilt:
            try:
                await asyncio.to_thread(mirror.publish_twins, key[0], key[1], seg.path.name)
            except LaneError as exc:
                log.warning("decoded twin of %s not in the bucket yet: %s", seg.path, exc)

    async def assign_one(self, key: PartitionKey) -> bool:
        """Set a partition up to be consumed; False when it is held (diverged)."""
        s, ctx = self.s, self.s.ctx
        topic, partition = key
        layout = ctx.layout
        marker = await asyncio.to_thread(read_divergence, layout, topic, partition)
        if marker is not None:
            if not self._new_epoch_on_divergence():
                await self.hold(key, marker, persist=False)
                return False
            await asyncio.to_thread(close_epoch, layout, topic, partition)
            self._release(key)
        epoch = await asyncio.to_thread(current_epoch, layout, topic, partition)
        self._epochs[key] = epoch
        if ctx.mirror is not None:
            await self._restore(key)
        missing = await asyncio.to_thread(repair, layout, topic, partition)
        decoder = self._decoders.get(topic)
        if missing and decoder is not None:
            await asyncio.to_thread(
                redecode, ctx.writer, decoder, ctx.columns, topic, partition, missing
            )
            if ctx.mirror is not None:
                await self._publish_twins(key, missing)
        cov = await asyncio.to_thread(scan_coverage, layout, topic, partition)
        committed = await s.source.committed(key)
        log_start = await self._log_start(key)
        seek_to = resume = resume_position(cov, committed)
        if epoch > 0 and cov.end is None:
            # A new epoch starts with the broker's log; what the group committed belongs
            # to the closed one.
            seek_to = resume = log_start if log_start is not None else 0
            committed = None
        elif s.source.positions_are_offsets and cov.end is not None and resume == cov.end:
            # (Resuming past the lane's end — the group committed what another member's
            # lane holds — leaves nothing of this lane to compare at the resume point.)
            if log_start is not None:
                div = check_start(topic, partition, epoch, cov.end, log_start)
                if div is not None:
                    await self.hold(key, div)
                    return False
            last = await asyncio.to_thread(
                last_record, layout, ctx.columns, topic, partition, resume
            )
            if last is not None and (log_start is None or last.offset >= log_start):
                # Fetch the lane's last record once more and compare it (_verified).
                self._verify[key] = last
                seek_to = last.offset
        if s.source.positions_are_offsets and committed is not None and resume == committed:
            await asyncio.to_thread(self._note_skipped, key, cov, committed, log_start)
        if seek_to is not None:
            s.source.seek(key, seek_to)
        if resume is not None:
            self._next[key] = resume
        buf = self.new_buffer(key, resume, committed)
        s.parts[key] = buf
        ctx.live.reset(topic, partition, resume)
        self._gauge_start(key, resume, committed)
        caught_up = resume is not None and (committed is None or resume > committed)
        if caught_up and key not in self._verify:
            # The lane already holds these records durably: catch the group up.
            await self._checkpoint.commit(buf)
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

    async def _restore(self, key: PartitionKey) -> None:
        """Make the local lane the object store's before anything decides where to
        resume (lane/remote/mirror.py); retried while the store does not answer (the partition
        stays paused meanwhile)."""
        mirror = self.s.ctx.mirror
        if mirror is None:
            raise InvariantError("mirror is not set")
        backoff = new_backoff()
        while True:
            try:
                report = await asyncio.to_thread(mirror.restore, *key)
            except LaneError as exc:
                if not exc.retriable:
                    raise
                delay = await backoff.wait()
                log.error("%s[%d]: restoring from the object store: %s; retried in %.1fs",
                          *key, exc, delay)  # fmt: skip
                continue
            if report.fetched or report.removed or report.superseded:
                log.info(
                    "%s[%d]: restored from the object store: %d fetched, %d local-only "
                    "removed, %d superseded by a newer generation",
                    *key,
                    report.fetched,
                    report.removed,
                    report.superseded,
                )
            return

    def _gauge_start(self, key: PartitionKey, resume: int | None, committed: int | None) -> None:
        metrics, labels = self.s.ctx.metrics, self.s.labels(key)
        metrics.diverged.labels(*labels).set(0)
        if resume is not None:
            metrics.durable.labels(*labels).set(resume)
            metrics.consumed.labels(*labels).set(resume)
        if committed is not None:
            metrics.committed.labels(*labels).set(committed)

    def _note_skipped(
        self, key: PartitionKey, cov: Coverage, committed: int, log_start: int | None
    ) -> None:
        """Record, before anything is written, the positions the group committed that
        this lane does not hold (lane/read/elsewhere.py): another replica's data_dir has them,
        or this data_dir is newer than the group's commits."""
        topic, partition = key
        layout = self.s.ctx.layout
        below = [end for _, end in cov.ranges if end <= committed]
        first = max(below) if below else (log_start if log_start is not None else 0)
        first = max(first, layout.floor(topic, partition))
        if first >= committed:
            return
        record_elsewhere(layout, topic, partition, first, committed)
        log.warning(
            "%s[%d]: resuming at the group's commit %d; offsets %d-%d are not in this "
            "data_dir (another replica ingested them) and reads of them are refused here",
            topic,
            partition,
            committed,
            first,
            committed - 1,
        )

    def new_buffer(
        self, key: PartitionKey, durable: int | None, committed: int | None
    ) -> PartitionBuffer:
        return PartitionBuffer.create(
            key[0],
            key[1],
            durable=durable,
            committed=committed,
            columns=self.s.ctx.columns,
            decoded=self._decoders.for_topic(key[0]) is not None,
            head_start=self.s.ctx.raw_cfg.roll_age_s * roll_phase(key[1]),
        )

    def forget(self, key: PartitionKey) -> None:
        self.s.parts.pop(key, None)
        self.s.held.pop(key, None)
        self._next.pop(key, None)
        self._verify.pop(key, None)
        self._epochs.pop(key, None)
        self._first_fetched.pop(key, None)

    def drop(self, key: PartitionKey, why: str) -> None:
        """Forget what ``key`` buffered (never written, never committed) and rewind it:
        ownership is in doubt, so these records are a zombie's late writes, counted in
        ``twg_fenced_records_total`` (the partition's owner reads them again)."""
        s = self.s
        buf = s.parts.get(key)
        if buf is None:
            return
        if buf.held_rows:
            log.warning("%s[%d]: dropped %d buffered records: %s", *key, buf.held_rows, why)
            s.ctx.metrics.fenced.labels(*s.labels(key)).inc(buf.held_rows)
        s.parts[key] = self.new_buffer(key, buf.durable, buf.committed)
        rewind = buf.durable if buf.durable is not None else self._first_fetched.get(key)
        s.ctx.live.reset(key[0], key[1], rewind)
        if rewind is not None:
            # Should the partition still be ours, it is read again from there.
            s.source.seek(key, rewind)
            self._next[key] = rewind

    def report(self) -> None:
        """What the source holds, in its /health entry."""
        s = self.s
        held = sorted(f"{t}[{p}]" for t, p in s.parts)
        group = s.features.group_id
        note = (
            f"holds {len(held)} partition(s)"
            if held
            else "holds no partition: the group's other members hold them all"
            if group
            else "holds no partition yet"
        )
        s.ctx.health.annotate(
            s.component,
            partitions=held,
            held_diverged=sorted(f"{t}[{p}]" for t, p in s.held),
            assignment=note,
        )

    # -- every fetched batch -------------------------------------------------------

    async def admit(self, key: PartitionKey, raw: pa.RecordBatch) -> pa.RecordBatch | None:
        """``raw`` once the log is known to continue the lane, with this epoch's record
        ids; None when nothing of it is to be ingested."""
        s = self.s
        if not s.source.positions_are_offsets:
            return raw
        expected = self._verify.get(key)
        if expected is not None:
            checked = await self._verified(key, raw, expected)
            if checked is None:
                return None
            raw = checked
        positions = raw.column(s.ctx.columns.position)
        first = int(positions[0].as_py())
        self._first_fetched.setdefault(key, first)
        epoch = self._epochs.get(key, 0)
        want = self._next.get(key)
        if want is not None and first < want:
            end = s.source.highwater(key)
            await self.diverge(key, offset_went_back(*key, epoch, first, want, end))
            return None
        self._next[key] = int(positions[-1].as_py()) + 1
        if epoch:
            raw = with_epoch_ids(raw, s.ctx.columns, s.cfg.cluster_name, *key, epoch)
        return raw

    async def _verified(
        self, key: PartitionKey, raw: pa.RecordBatch, expected: LastRecord
    ) -> pa.RecordBatch | None:
        """Compare the first fetch after an assignment with the lane's last record; the
        part of ``raw`` that is new (None when nothing is, or the log diverged)."""
        s, c = self.s, self.s.ctx.columns
        del self._verify[key]
        epoch = self._epochs.get(key, 0)
        positions = raw.column(c.position)
        first = int(positions[0].as_py())
        if first < expected.offset:
            await self.diverge(key, offset_went_back(*key, epoch, first, expected.offset, None))
            return None
        if not check_record(expected, raw, c):
            end = s.source.highwater(key)
            await self.diverge(key, record_mismatch(*key, epoch, expected, end))
            return None
        buf = s.parts.get(key)
        if buf is not None and buf.durable is not None and buf.durable != buf.committed:
            await self._checkpoint.commit(buf)  # deferred from the assignment until verified
        fresh = raw.filter(pc.greater_equal(positions, expected.resume))
        return fresh if fresh.num_rows else None

    # -- holding diverged partitions -----------------------------------------------

    async def hold(self, key: PartitionKey, div: Divergence, *, persist: bool = True) -> None:
        """Stop a partition whose broker log no longer continues its lane."""
        s, ctx = self.s, self.s.ctx
        s.source.pause([key])
        s.held[key] = div
        if persist:
            await asyncio.to_thread(mark_diverged, ctx.layout, div)
        log.error("%s", div.describe())
        ctx.metrics.diverged.labels(*s.labels(key)).set(1)
        name = self._component(key)
        ctx.health.register(name, "partition", gates_readiness=True)
        ctx.health.set(name, State.DOWN, div.describe(), info=div.info())
        if persist and self._new_epoch_on_divergence():
            await self._reopen(key)

    async def diverge(self, key: PartitionKey, div: Divergence) -> None:
        """Hold a partition found diverged while running: what it buffered before (read
        from the old log, which the broker no longer has) is made durable, never
        committed."""
        s = self.s
        s.held[key] = div
        s.source.pause([key])
        await self._checkpoint.flush_now(key)
        self.forget(key)
        await self.hold(key, div)

    async def check_held(self) -> None:
        """Pick up partitions whose divergence an operator resolved while held
        (``twg lane new-epoch`` closed the epoch: the marker is gone)."""
        for key in list(self.s.held):
            marker = await asyncio.to_thread(read_divergence, self.s.ctx.layout, *key)
            if marker is None and key in self.s.held:
                log.warning("%s[%d]: divergence resolved by the operator; resuming", *key)
                await self._reopen(key)

    async def check_log_ends(self) -> None:
        """Hold partitions whose broker log now ends below what was already ingested
        (the broker lost data, or a recreated topic is shorter than the lane). On
        brokers that report the old position out of range the fetch check sees it
        first; others (tansu) simply wait at the old position, so the log end from the
        last fetch response is compared here."""
        s = self.s
        if not s.source.positions_are_offsets or s.broker_down:
            return
        for key in list(s.parts):
            want = self._next.get(key)
            end = s.source.highwater(key)
            if want is None or end is None or end >= want or key in s.held:
                continue
            await self.diverge(key, log_shrank(*key, self._epochs.get(key, 0), want, end))

    def _release(self, key: PartitionKey) -> None:
        """A held partition is going again: clear its health entry and gauge."""
        self.s.held.pop(key, None)
        self.s.ctx.health.remove(self._component(key))
        self.s.ctx.metrics.diverged.labels(*self.s.labels(key)).set(0)

    async def _reopen(self, key: PartitionKey) -> None:
        """Start a held partition again (its epoch was closed, or is about to be)."""
        self._release(key)
        self.forget(key)
        if await self.assign_one(key):
            self.report()
            if not self.s.paused:
                self.s.source.resume([key])

    def _component(self, key: PartitionKey) -> str:
        return f"partition:{self.s.cfg.name}:{key[0]}[{key[1]}]"

    def _new_epoch_on_divergence(self) -> bool:
        return self.s.features.new_epoch_on_divergence

    async def _log_start(self, key: PartitionKey) -> int | None:
        if not self.s.source.positions_are_offsets:
            return None
        try:
            return await self.s.source.log_start(key)
        except SourceError as exc:
            # The record check and the fetch check still run; they need no bounds.
            log.warning("%s[%d]: log start unknown (%s); checked on fetch instead", *key, exc)
            return None
