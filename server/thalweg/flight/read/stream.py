"""The batches of one ``do_get``: history from Parquet, then the live tail.

For each partition the cursor moves through positions in order. Below the durable end it
reads segments; at or above it, live entries. The durable end only grows and a live
entry is dropped only once durable, so re-checking the durable end on every step makes
the seam exact even while segments are being written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from thalweg.errors import InvariantError, PartitionElsewhereError, ThalwegError
from thalweg.flight.read.plan import ReadPlan, start_of_new_partition
from thalweg.flight.read.prefetch import prefetched
from thalweg.lane.layout import Lane
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.lane.read.live import LiveEntry
from thalweg.lane.read.reader import offset_slice, rebatch
from thalweg.lane.read.shape import concat_decoded, fit_stream_schema, shape_decoded
from thalweg.records.columns import MetadataPolicy

_WAIT_S = 0.2
_DISCOVER_EVERY_S = 1.0


def _now_us() -> int:
    return time.time_ns() // 1000


class FollowLagError(ThalwegError):
    """A follow stream fell further behind its partition's newest record than allowed."""


class HistoryGapError(ThalwegError):
    """A read reached positions this gateway's lane does not hold and will not: it ends
    there rather than step over them (a silently partial read)."""


_GAP_WAIT_S = 30.0


class _Holes:
    """Partitions whose cursor stands in a hole of the lane, and since when.

    A hole may fill: a replica syncing an object store fetches segments in any order,
    and a member that returns to a partition restores what another member wrote. So a
    read waits for it, up to ``_GAP_WAIT_S``; a hole another replica's ``data_dir``
    holds for good (``lane/read/elsewhere.py``) ends the read at once.
    """

    def __init__(self, catalog: LaneCatalog, topic: str) -> None:
        self._catalog = catalog
        self._topic = topic
        self._since: dict[int, float] = {}

    def upto(self, p: int, pos: int, want: int, cursors: dict[int, int]) -> int | None:
        """How far partition ``p``'s history may be read from ``pos`` towards ``want``;
        None while its cursor stands in a hole (raises once the hole is given up on)."""
        run = self._catalog.run_from(self._topic, p, pos)
        if run.gap is not None:
            self._wait(p, run.gap, run.held, cursors)
            return None
        self._since.pop(p, None)
        return want if run.end is None else min(want, run.end)

    def _wait(self, p: int, gap: tuple[int, int], held: bool, cursors: dict[int, int]) -> None:
        now = time.monotonic()
        since = self._since.setdefault(p, now)
        self._catalog.refresh(self._topic, p)
        if not held and now - since < _GAP_WAIT_S:
            return
        lo, hi = gap
        resume = ", ".join(f"{q}: {o}" for q, o in sorted(cursors.items()))
        where = (
            "another replica's data_dir holds them (docs/lanes.md, many gateways)"
            if held
            else f"they did not arrive within {_GAP_WAIT_S:.0f} s"
        )
        raise HistoryGapError(
            f"{self._topic}[{p}]: offsets {lo}-{hi - 1} are not in this gateway's lane: "
            f"{where}. Nothing past them was sent; every partition resumes at "
            f"{{{resume}}}"
        )


def read_stream(
    catalog: LaneCatalog,
    plan: ReadPlan,
    cancelled: Callable[[], bool],
    *,
    max_lag: int | None = None,
    moved: Callable[[int], str | None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the plan's rows; ends when every partition reached its end or on cancel.

    The generator only advances when the client takes a batch (gRPC flow control), so a
    slow reader holds at most the batch in hand; behind the live tail it reads history
    from Parquet, never making the gateway keep rows for it. A follow partition that has
    once caught up and then falls more than ``max_lag`` records behind the durable end
    raises :class:`FollowLagError`, naming the offsets to resume from. A follow stream
    over all of a topic's partitions picks up partitions that appear while it runs (a
    partition's first record, a partition added to the topic).

    A follow partition that ``moved`` says another gateway owns now (a rebalance) ends
    the stream once everything this gateway holds of it was sent, with
    :class:`PartitionElsewhereError` naming the owner and where every partition of the
    stream resumes — the client continues there without a gap or a duplicate.
    """
    topic = plan.ticket.topic
    if plan.ticket.lane is Lane.DLQ:
        yield from _dead_letters(catalog, plan)
        return
    cursors = {r.partition: r.start for r in plan.ranges}
    ends = {r.partition: r.end for r in plan.ranges}
    off = catalog.columns.position
    pushdown = _pushdown(catalog, plan)
    active = sorted(cursors)
    caught_up: set[int] = set()
    discover = plan.ticket.end == "follow" and plan.ticket.partitions is None
    holes = _Holes(catalog, topic)
    next_scan = time.monotonic() + _DISCOVER_EVERY_S
    while active or discover:
        seen = catalog.live_version()
        if discover and time.monotonic() >= next_scan:
            next_scan = time.monotonic() + _DISCOVER_EVERY_S
            _discover(catalog, plan, cursors, ends, active)
        progressed = False
        # One pass takes the live rows of every partition that has some and sends them
        # as one batch: shaped and sent entry by entry, a fetch's small batches over many
        # partitions cost a shaping and a Flight message each, and the stream fell
        # behind the tail. A partition's cursor moves when its rows are sent.
        taken = _LiveRows()
        for p in list(active):
            pos, end = cursors[p], ends[p]
            if end is not None and pos >= end:
                active.remove(p)
                continue
            if end is None and max_lag is not None:
                _check_lag(catalog, topic, p, pos, max_lag, caught_up, cursors)
            durable = catalog.durable_end(topic, p)
            if pos < durable:
                upto = holes.upto(p, pos, durable if end is None else min(durable, end), cursors)
                if upto is None:
                    continue
                for table, done in _history(catalog, plan, p, pos, upto, pushdown, cancelled):
                    yield from rebatch(table)
                    if end is None and max_lag is not None and done is not None:
                        _check_lag(catalog, topic, p, done, max_lag, caught_up, cursors)
                cursors[p] = upto
                progressed = True
                continue
            live = catalog.live_from(topic, p, pos)
            for entry in live:
                lo, hi = offset_slice(entry.raw, off, pos, end)
                taken.add(
                    p, entry, lo, hi, entry.last + 1 if end is None else min(entry.last + 1, end)
                )
                progressed = True
            owner = moved(p) if not live and end is None and moved is not None else None
            if owner is not None:
                yield from taken.send(catalog, plan, cursors)
                _relocate(topic, p, owner, cursors)
        yield from taken.send(catalog, plan, cursors)
        if not progressed and (active or discover):
            if cancelled():
                return
            catalog.wait_live(seen, _WAIT_S)


def _discover(
    catalog: LaneCatalog,
    plan: ReadPlan,
    cursors: dict[int, int],
    ends: dict[int, int | None],
    active: list[int],
) -> None:
    """Partitions of the topic that appeared since the stream began join it."""
    for p in catalog.partitions(plan.ticket.topic):
        if p not in cursors:
            cursors[p], ends[p] = start_of_new_partition(catalog, plan.ticket, p), None
            active.append(p)


class _LiveRows:
    """Live rows taken from several partitions in one pass, sent as one shaped batch."""

    def __init__(self) -> None:
        self._raw: list[pa.RecordBatch] = []
        self._decoded: list[pa.Table] = []
        self._next: dict[int, int] = {}

    def add(self, p: int, entry: LiveEntry, lo: int, hi: int, after: int) -> None:
        """Rows ``[lo, hi)`` of ``entry``; partition ``p`` continues at ``after``."""
        if hi > lo:
            self._raw.append(entry.raw.slice(lo, hi - lo))
            if entry.decoded is not None:
                self._decoded.append(entry.decoded.slice(lo, hi - lo))
        self._next[p] = after

    def send(
        self, catalog: LaneCatalog, plan: ReadPlan, cursors: dict[int, int]
    ) -> Iterator[pa.RecordBatch]:
        """The rows taken, shaped once; then the cursors of their partitions move."""
        if self._raw:
            raw = pa.Table.from_batches(self._raw)
            dec = concat_decoded(self._decoded) if self._decoded else None
            self._raw, self._decoded = [], []
            yield from rebatch(_shape(catalog, plan, raw, dec))
        cursors.update(self._next)
        self._next = {}


def _relocate(topic: str, p: int, owner: str, cursors: dict[int, int]) -> None:
    raise PartitionElsewhereError(
        f"{topic}[{p}] moved to {owner} (a group rebalance); this stream sent "
        f"everything this gateway holds: resume at offset {cursors[p]} there",
        topic=topic,
        owner=owner,
        positions=dict(cursors),
    )


def _history(
    catalog: LaneCatalog,
    plan: ReadPlan,
    p: int,
    pos: int,
    upto: int,
    pushdown: tuple[set[str] | None, pc.Expression | None],
    cancelled: Callable[[], bool],
) -> Iterator[tuple[pa.Table, int | None]]:
    """Partition ``p``'s durable rows ``[pos, upto)`` in the plan's shape, segment by
    segment, read ahead (``prefetch``); with each, the position after its last row."""
    decoded = plan.ticket.lane is Lane.DECODED
    wanted, pushed = pushdown
    pairs = catalog.read_pairs(
        plan.ticket.topic,
        p,
        pos,
        upto,
        decoded=decoded,
        with_raw=not decoded or plan.ticket.metadata is MetadataPolicy.ALL,
        wanted=wanted,
        predicate=pushed,
    )
    off = catalog.columns.position
    shaped = ((_shape(catalog, plan, raw, dec), _end_of(raw, dec, off)) for raw, dec in pairs)
    yield from prefetched(shaped, cancelled)


def _end_of(raw: pa.Table | None, dec: pa.Table | None, off: str) -> int | None:
    """The position after the last row of a segment read (None when it has no rows)."""
    ref = dec if dec is not None else raw
    if ref is None or not len(ref):
        return None
    return int(ref.column(off)[-1].as_py()) + 1


def _check_lag(
    catalog: LaneCatalog,
    topic: str,
    p: int,
    pos: int,
    max_lag: int,
    caught_up: set[int],
    cursors: dict[int, int],
) -> None:
    """Lag is what is already durable and not yet sent: records that just arrived are
    not lag (a reader that keeps up reads them from the live tail). A partition counts
    once its cursor has reached the durable end; catching up from history is not lag."""
    end = catalog.durable_end(topic, p)
    lag = end - pos  # positions: an upper bound on records (exact for dense offsets)
    if lag <= 0:
        caught_up.add(p)
    elif p in caught_up and lag > max_lag:
        # Positions can be sparse (Pulsar's packed ids, compacted Kafka): count records.
        lag = min(lag, catalog.records_between(topic, p, pos, end))
        if lag <= max_lag:
            return
        resume = ", ".join(f"{q}: {o}" for q, o in sorted(cursors.items()))
        raise FollowLagError(
            f"follow stream of {topic!r} fell {lag} records behind partition {p}'s durable end "
            f"(gateway.flight.follow_max_lag_records = {max_lag}); read faster, or "
            f"resume from positions {{{resume}}}"
        )


def _dead_letters(catalog: LaneCatalog, plan: ReadPlan) -> Iterator[pa.RecordBatch]:
    """Dead-letter segments overlapping each partition's range (durable history only)."""
    off = catalog.columns.position
    sink = plan.ticket.sink
    for r in plan.ranges:
        end = r.end if r.end is not None else catalog.durable_end(plan.ticket.topic, r.partition)
        segs = catalog.dead_letter_segments(plan.ticket.topic, r.partition, sink)
        for seg in segs:
            if seg.last < r.start or seg.first >= end:
                continue
            table = pq.read_table(seg.path).replace_schema_metadata(None)
            lo, hi = offset_slice(table, off, r.start, end)
            if hi > lo:
                yield from rebatch(plan.finish(table.slice(lo, hi - lo).cast(plan.full_schema)))


def _pushdown(catalog: LaneCatalog, plan: ReadPlan) -> tuple[set[str] | None, pc.Expression | None]:
    """Which columns a segment read needs, and whether the filter can go into it.

    Columns: the projected ones, the filter's, and the two the read itself uses (the
    position it slices by, the decode error a read without metadata leaves rows out
    by) — not every locator column: a latest view spent a third of its read on record
    ids it never sends. The filter is pushed only when it names columns the one file
    read holds.
    """
    t = plan.ticket
    if t.columns is None:
        wanted = None
    else:
        filter_cols = {c.column for c in t.filter or []}
        meta = {catalog.columns.position, catalog.columns.decode_error}
        wanted = set(t.columns) | filter_cols | meta
    if plan.predicate is None or (t.lane is Lane.DECODED and t.metadata is MetadataPolicy.ALL):
        return wanted, None
    filter_cols = {c.column for c in t.filter or []}
    if t.lane is Lane.RAW:
        stored = set(catalog.columns.raw_schema.names)
    else:
        stored = set(plan.payload_schema.names) | {
            f.name for f in catalog.columns.decoded_file_fields
        }
    return wanted, plan.predicate if filter_cols <= stored else None


def shape_live(
    catalog: LaneCatalog, plan: ReadPlan, entry: LiveEntry, lo: int, hi: int
) -> pa.Table:
    """Rows ``[lo, hi)`` of a live entry in the plan's shape (also Flight SQL's live rows)."""
    raw = pa.Table.from_batches([entry.raw.slice(lo, hi - lo)])
    dec = entry.decoded.slice(lo, hi - lo) if entry.decoded is not None else None
    return _shape(catalog, plan, raw, dec)


def _shape(
    catalog: LaneCatalog, plan: ReadPlan, raw: pa.Table | None, dec: pa.Table | None
) -> pa.Table:
    if plan.ticket.lane is Lane.RAW:
        if raw is None:
            raise InvariantError("raw is not set")
        return plan.finish(fit_stream_schema(raw, plan.shape_schema))
    if dec is None:
        raise InvariantError("dec is not set")
    shaped = shape_decoded(
        dec, raw, plan.shape_schema, catalog.columns, plan.ticket.metadata, _now_us()
    )
    return plan.finish(shaped)
