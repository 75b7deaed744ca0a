"""One loop feeds a sink from the durable lanes: the live edge and the replay alike.

A sink never sees a record before the raw lane holds it durably, so its position can lag
the source's but never lead it (ADR-0012/0050 in the seed plan). Its work list is always
the same question — what does the raw lane cover that this sink does not? — answered
from the coverage store; at the live edge the answer is the newest segments, after an
outage it is the whole gap, and after a crash it is whatever the store (or the
destination's own record, trusted over it) does not claim. So there is no second,
rarely-run recovery path: recovery is the feed, run against a bigger gap.

What is read, and how a window's positions become spans, is ``recovery.reading``. A
span is added to the store only after the sink's flush returned. A replay that is
catching up is throttled to ``recovery.max_duty`` of wall time so live ingest keeps
most of its rate.

Its length: one sink's feed loop — catching up, following the live lane, setting aside
what the destination refuses (``recovery.isolate``, ``recovery.refused``) and reporting
health — shares the sink's coverage and its failure state; the parts that need none of
it already live apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

from thalweg.codecs.base import ArrowDecoder
from thalweg.config.sinks import RecoveryConfig
from thalweg.lane.coverage import Coverage
from thalweg.lane.epochs import current_epoch
from thalweg.lane.layout import LaneLayout
from thalweg.lane.remote.mirror import LaneMirror
from thalweg.lane.writer import SegmentWriter
from thalweg.ops.health import Health, State
from thalweg.ops.metrics import Metrics
from thalweg.ops.retry import Backoff
from thalweg.records.columns import MetadataColumns
from thalweg.records.ranges import subtract_ranges
from thalweg.recovery.coverage import CoverageStore
from thalweg.recovery.isolate import Item, by_partition, isolate
from thalweg.recovery.reading import SpanReader, Transform
from thalweg.recovery.recheck import deleted_behind, rechecks
from thalweg.recovery.refused import SinkDeadLetters
from thalweg.sinks.base import (
    BufferedSink,
    CoverageKey,
    Landed,
    Sink,
    SinkBackpressureError,
    SinkError,
    SinkRefusedError,
    SinkSchemaError,
    SinkState,
    SinkUnavailableError,
)

log = logging.getLogger(__name__)

_HEALTH = {SinkState.UP: State.UP, SinkState.DEGRADED: State.DEGRADED, SinkState.DOWN: State.DOWN}
RECHECK_SHARE = 0.05  # at most this share of a running feeder's time goes to rechecks


@dataclass
class PassSummary:
    """What one pass did (``twg recover`` prints it)."""

    rows: int = 0
    positions: int = 0
    flushes: int = 0
    seconds: float = 0.0
    lag_before: int = 0
    lag_after: int = 0
    waiting: str = ""  # why some gap was left (a decoded twin not there yet)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class SinkFeeder:
    """Feeds one sink from ``layout``, recording what landed in ``store``.

    Args:
        decoder_for: the ingesting source's decoder of a topic, to rebuild a missing
            decoded twin (None in a recovery-only process: the gap then waits for the
            ingesting gateway to rebuild it on its next assignment).
        writer: where a rebuilt twin is written (with ``decoder_for``).
        transform: a node chain applied to each segment's rows (``recovery.reading``).
        node: read this materialised node's lane, not the topic's: a sink or lane below
            it (its gaps are then what that lane holds and this sink does not).
        mirror: the lanes' bucket, which keeps the sink's dead-letter lane too
            (``lane/remote/refused_sync.py``); None: local lanes.
    """

    def __init__(
        self,
        sink: Sink[Any],
        store: CoverageStore,
        layout: LaneLayout,
        columns: MetadataColumns,
        recovery: RecoveryConfig,
        *,
        metrics: Metrics | None = None,
        health: Health | None = None,
        decoder_for: Callable[[str], ArrowDecoder | None] | None = None,
        writer: SegmentWriter | None = None,
        transform: Transform | None = None,
        node: str | None = None,
        mirror: LaneMirror | None = None,
    ) -> None:
        self.sink = sink
        self.mirror = mirror
        self.store = store
        self.layout = layout
        self.columns = columns
        self.cfg = recovery
        self.metrics = metrics
        self.health = health
        self.component = f"sink:{sink.name}"
        self.reader = SpanReader(
            layout,
            columns,
            raw=sink.cfg.raw,
            metadata=sink.cfg.read_metadata(),
            decoder_for=decoder_for,
            writer=writer,
            transform=transform,
            node=node,
        )
        self._pending: dict[CoverageKey, Coverage] = {}
        self._written: list[Item] = []  # what the next flush lands, kept to isolate refusals
        self.refused = SinkDeadLetters(layout, sink.name, columns, metrics)
        self.refused_records = 0  # set aside since start (for /health)
        self._buffered = 0
        self._buffered_bytes = 0
        self._last_flush = time.monotonic()
        self._opened = False
        self._inflight: asyncio.Task[None] | None = None
        self._rechecks = recovery.recheck_every_flushes > 0 and rechecks(
            sink, derived=transform is not None or node is not None
        )
        self._flushes_unchecked = 0
        self._recheck_not_before = 0.0  # monotonic: keeps the rechecks' share of time small
        self.lost_records = 0  # found deleted behind its back and fed again (for /health)
        if health is not None:
            health.register(self.component, "sink", gates_readiness=False)

    # -- lifecycle ---------------------------------------------------------------------

    async def open(self) -> None:
        """Connect the sink and take its own record of coverage over the store's."""
        if self.mirror is not None:
            # What this sink set aside on another host (a wiped cache) is here before
            # anything is rechecked or fed; what this host set aside goes up.
            await asyncio.to_thread(self.mirror.sync_refused, self.sink.name)
        trusted = await self.sink.open()
        if trusted is not None:
            self.store.replace(trusted.ranges)
            await asyncio.to_thread(self.store.flush)
        self._pending.clear()
        self._opened = True
        if self._rechecks:
            await self.recheck()

    async def recheck(self) -> int:
        """Compare the destination's rows with what its coverage says it holds, and make
        the positions of rows deleted behind the gateway's back gaps again, so the next
        pass feeds them once more (``recovery/recheck.py``); how many were found."""
        await self._settle()  # the store must claim exactly what the destination committed
        self._flushes_unchecked = 0
        began = time.monotonic()
        try:
            lost = await asyncio.to_thread(
                deleted_behind, self.sink, self.layout, self.columns, self.store.snapshot()
            )
        except Exception as exc:  # a damaged file, a database gone: the feed goes on
            log.warning("sink %s: its rows could not be rechecked: %s", self.sink.name, exc)
            if self.health is not None:
                self.health.annotate(self.component, recheck_error=str(exc))
            return 0
        finally:
            # A check costs what the table holds (1.2 s per million Postgres rows): the
            # next waits until this one is at most RECHECK_SHARE of the time since.
            took = time.monotonic() - began
            self._recheck_not_before = time.monotonic() + took * (1 / RECHECK_SHARE - 1)
        found = sum(b - a for ranges in lost.values() for a, b in ranges)
        if not found:
            return 0
        for key, ranges in lost.items():
            self.store.remove(key, ranges)
        await asyncio.to_thread(self.store.flush)
        self.lost_records += found
        if self.metrics is not None:
            self.metrics.sink_rows_lost.labels(self.sink.name).inc(found)
        if self.health is not None:
            self.health.annotate(self.component, lost_records=self.lost_records)
        first = next(iter(lost.items()))
        log.warning(
            "sink %s: %d records its coverage claims are no longer in the destination "
            "(deleted behind the gateway's back); feeding them again. First: %s[%d] "
            "positions %d-%d",
            self.sink.name,
            found,
            first[0][0],
            first[0][1],
            first[1][0][0],
            first[1][0][1] - 1,
        )
        return found

    async def run(self, stop: asyncio.Event) -> None:
        """Feed until ``stop``; a failing sink is retried with backoff and never stops
        anything else (ingest, commits, other sinks)."""
        backoff = Backoff(base_s=0.5, cap_s=self.cfg.retry_max_s)
        try:
            while not stop.is_set():
                try:
                    try:
                        if not self._opened:
                            await self.open()
                        await self.pass_once(stop=stop)
                        await self._flush_if_due()
                        if (
                            self._rechecks
                            and self._flushes_unchecked >= self.cfg.recheck_every_flushes
                            and time.monotonic() >= self._recheck_not_before
                        ):
                            await self.recheck()
                    except Exception:
                        # A commit still in flight finishes (or fails) before the sink
                        # is reopened: it shares the sink's connection.
                        with contextlib.suppress(Exception):
                            await self._settle()
                        raise
                except asyncio.CancelledError:
                    raise
                except SinkBackpressureError as exc:
                    self._failed(exc)
                    await _sleep(stop, exc.retry_after_s)
                    continue
                except SinkSchemaError as exc:
                    self._failed(exc)
                    # A schema refusal waits for a person, not for a backoff.
                    await _sleep(stop, self.cfg.degraded_retry_s)
                    continue
                except SinkUnavailableError as exc:
                    self._failed(exc)
                    if exc.retry_after_s is None:
                        await backoff.wait(stop)
                    else:  # the destination said when (a sidecar's breaker probes)
                        await _sleep(stop, min(exc.retry_after_s, self.cfg.retry_max_s))
                    continue
                except Exception as exc:  # any backend failure: the sink is down, not us
                    self._failed(exc)
                    await backoff.wait(stop)
                    continue
                backoff.reset()
                self._report(self.sink.health().state, self.sink.health().detail)
                await _sleep(stop, self.cfg.poll_interval_s)
        finally:
            await self.close()

    async def close(self) -> None:
        """Flush what is buffered (bounded: a dead sink must not hold the stop up),
        close the sink and release the coverage store. After :meth:`run` ends this has
        run; a caller of :meth:`open` and :meth:`pass_once` calls it itself."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._settle(), timeout=10.0)
        with contextlib.suppress(Exception):
            if self._opened and self._pending:
                await asyncio.wait_for(self.flush(), timeout=10.0)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.store.flush)
        with contextlib.suppress(Exception):
            await self.sink.close()
        self.store.release()

    # -- one pass ----------------------------------------------------------------------

    async def pass_once(
        self,
        *,
        stop: asyncio.Event | None = None,
        topic: str | None = None,
        start: int | None = None,
        end: int | None = None,
        final: bool = False,
    ) -> PassSummary:
        """Write every gap of the sink (limited to ``topic`` and ``[start, end)``) in
        bounded windows; with ``final`` flush at the end, else flush when due."""
        began = time.monotonic()
        summary = PassSummary()
        await self._settle()  # the gaps below must not include a commit in flight
        lanes = await asyncio.to_thread(self._lane_ranges, topic, start, end)
        work = self._work(lanes)
        summary.lag_before = sum(b - a for _, gaps in work for a, b in gaps)
        for key, gaps in work:
            if self._other_epoch_pending(key):
                await self._settle()
                await self.flush()
                summary.flushes += 1
            for a, b in gaps:
                pos = a
                while pos < b:
                    if stop is not None and stop.is_set():
                        await self._settle()
                        return summary
                    t0 = time.monotonic()
                    limit = min(b, pos + self.cfg.window_records)
                    items, reached, waiting = await asyncio.to_thread(
                        self.reader.window, key, pos, limit, b
                    )
                    for rows, span in items:
                        await self.sink.write(rows, span)
                        self._written.append((rows, span))
                        self._pending.setdefault(key, Coverage()).add(span.start, span.end)
                        self._buffered += rows.num_rows
                        self._buffered_bytes += rows.nbytes
                        summary.rows += rows.num_rows
                        summary.positions += span.end - span.start
                    if reached <= pos:  # nothing readable here yet
                        summary.waiting = waiting
                        break
                    pos = reached
                    if await self._flush_if_due(behind=True):
                        summary.flushes += 1
                    if pos < b:  # still catching up: leave ingest its share
                        busy = time.monotonic() - t0
                        await _sleep(stop, busy * (1 / self.cfg.max_duty - 1))
        await self._settle()
        if final and self._pending:
            await self.flush()
            summary.flushes += 1
        self.reader.forget()
        summary.lag_after = self._lag_of(
            lanes, whole=topic is None and start is None and end is None
        )
        summary.seconds = time.monotonic() - began
        return summary

    def lag(self) -> int:
        """Positions the lane covers and the sink has not landed durably (reading the
        lane's coverage now); sets the metric and the /health entry."""
        return self._lag_of(self._lane_ranges(None, None, None), whole=True)

    def lag_by_topic(self) -> dict[str, int]:
        """The lag of each of the sink's topics now (the lag gate's view)."""
        return self._lag_by_topic(self._lane_ranges(None, None, None))

    def _lag_by_topic(
        self, lanes: list[tuple[CoverageKey, list[tuple[int, int]]]]
    ) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, lane in lanes:
            gaps = self.store.gaps(key, lane)
            out[key[0]] = out.get(key[0], 0) + sum(b - a for a, b in gaps)
        return out

    def _lag_of(
        self, lanes: list[tuple[CoverageKey, list[tuple[int, int]]]], *, whole: bool
    ) -> int:
        """The lag against lane ranges already read (a pass reads them once); the metric
        and /health take only the whole sink's."""
        total = sum(self._lag_by_topic(lanes).values())
        if whole:
            if self.metrics is not None:
                self.metrics.sink_lag.labels(self.sink.name).set(total)
            if self.health is not None:
                self.health.annotate(self.component, lag_records=total, kind=self.sink.kind)
        return total

    def _lane_ranges(
        self, topic: str | None, start: int | None, end: int | None
    ) -> list[tuple[CoverageKey, list[tuple[int, int]]]]:
        out = []
        for t in self.sink.cfg.topics:
            if topic is not None and t != topic:
                continue
            for p in self.layout.partitions(t):
                epoch = current_epoch(self.layout, t, p)
                lane = self.reader.lane_ranges(t, p, epoch)
                lo = start if start is not None else 0
                hi = end if end is not None else 1 << 62
                clipped = [(max(a, lo), min(b, hi)) for a, b in lane if min(b, hi) > max(a, lo)]
                out.append(((t, p, epoch), clipped))
        return out

    def _work(
        self, lanes: list[tuple[CoverageKey, list[tuple[int, int]]]]
    ) -> list[tuple[CoverageKey, list[tuple[int, int]]]]:
        """Per partition, the lane's ranges that neither the store nor the unflushed
        writes hold."""
        out = []
        for key, lane in lanes:
            gaps = self.store.gaps(key, lane)
            pending = self._pending.get(key)
            if pending is not None:
                gaps = subtract_ranges(gaps, pending.ranges)
            if gaps:
                out.append((key, gaps))
        return out

    # -- flushing ----------------------------------------------------------------------

    def _other_epoch_pending(self, key: CoverageKey) -> bool:
        """Whether rows of another epoch of ``key``'s partition wait to be flushed.

        A flush never holds two epochs of one partition: rows carry no epoch, and a
        routed sink's replay after a cut (``sinks/routes.not_held``) tells what a table
        holds by position — two epochs whose positions overlap (a broker that came back
        with other offsets) in one flush could not be told apart."""
        return any(k[:2] == key[:2] and k[2] != key[2] for k in self._pending)

    async def _flush_if_due(self, *, behind: bool = False) -> bool:
        """Flush when the interval passed, the buffer is full, or ``commit_rows`` or
        ``commit_bytes`` are waiting (whichever comes first); with ``behind``, the
        commit runs while the next window is read (one commit in flight at most)."""
        cfg = self.sink.cfg
        due = time.monotonic() - self._last_flush >= cfg.commit_interval_s
        full = self._buffered >= cfg.max_buffered_rows
        by_rows = cfg.commit_rows is not None and self._buffered >= cfg.commit_rows
        by_bytes = cfg.commit_bytes is not None and self._buffered_bytes >= cfg.commit_bytes
        if self._pending and (due or full or by_rows or by_bytes):
            await self._settle()
            if behind:
                self._inflight = asyncio.create_task(self.flush())
            else:
                await self.flush()
            return True
        return False

    async def _settle(self) -> None:
        """Wait for the commit in flight, if any (raising its error)."""
        task, self._inflight = self._inflight, None
        if task is not None:
            await task

    async def flush(self) -> None:
        """Flush the sink; add what landed to the store and write it.

        What was written until now is taken at once: rows written while the commit runs
        belong to the next flush. If it fails, what it took is not landed — those spans
        stay gaps and are read again."""
        started = time.monotonic()
        rows, self._buffered = self._buffered, 0
        self._buffered_bytes = 0
        items, self._written = self._written, []
        self._pending = {}
        self._last_flush = time.monotonic()
        try:
            landed = await self.sink.flush()
        except SinkRefusedError as exc:
            if self.sink.cfg.on_refused != "dead_letter" or not isinstance(self.sink, BufferedSink):
                raise
            landed = await self._set_aside(self.sink, items, exc)
        for key, ranges in landed.ranges.items():
            for a, b in ranges:
                self.store.add(key, a, b)
        await asyncio.to_thread(self.store.flush)
        self._flushes_unchecked += 1
        if self.metrics is not None:
            self.metrics.sink_rows.labels(self.sink.name).inc(rows)
            self.metrics.sink_flush_seconds.labels(self.sink.name).observe(
                time.monotonic() - started
            )

    async def _set_aside(
        self, sink: BufferedSink[Any], items: list[Item], exc: SinkRefusedError
    ) -> Landed:
        """Land what the destination takes of a refused flush, write the records it
        refuses to the sink's dead-letter lane, then cover their positions too — in
        that order, so a refused record is durably somewhere before it counts as done."""
        found = await isolate(sink, items, exc, self.columns.position)
        if found.refused:
            written = 0
            for (topic, partition), (positions, errors) in by_partition(
                found.refused, self.columns.position
            ).items():
                written += await asyncio.to_thread(
                    self.refused.record, topic, partition, positions, errors
                )
            if self.mirror is not None:  # in the bucket before their positions are covered
                await asyncio.to_thread(self.mirror.sync_refused, self.sink.name)
            spans = [(pa.table({}), span) for piece, _ in found.refused for _, span in piece]
            found.add(await sink.land(spans))
            self.refused_records += written
            if self.health is not None:
                self.health.annotate(self.component, refused_records=self.refused_records)
            log.warning(
                "sink %s: the destination refused %d records for good; set aside in its "
                "dead-letter lane (%s), the sink goes on. First: %s",
                self.sink.name,
                written,
                self.layout.refused(self.sink.name).root,
                found.refused[0][1],
            )
        return found.landed

    def _failed(self, exc: Exception) -> None:
        reason = exc.reason if isinstance(exc, SinkError) else "error"
        state = SinkState.DEGRADED if isinstance(exc, SinkSchemaError) else SinkState.DOWN
        log.warning("sink %s %s: %s", self.sink.name, state.value, exc)
        self._pending.clear()
        self._written = []
        self._buffered = 0
        self._buffered_bytes = 0
        self._opened = False  # re-open: the destination's own record is trusted again
        if self.metrics is not None:
            self.metrics.sink_errors.labels(self.sink.name, reason).inc()
        self._report(state, f"{reason}: {exc}")
        with contextlib.suppress(Exception):
            self.lag()

    def _report(self, state: SinkState, detail: str) -> None:
        if self.health is not None:
            self.health.set(self.component, _HEALTH[state], detail)


async def _sleep(stop: asyncio.Event | None, seconds: float) -> None:
    if seconds <= 0:
        return
    if stop is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
