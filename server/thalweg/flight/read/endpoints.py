"""Split a read into Flight endpoints that clients can fetch in parallel.

One endpoint per partition, and for a bounded read over a large history one per slice:
consecutive raw-lane segments grouped until they hold about ``slice_rows`` records, each
slice an offset range with its own ticket. Segment boundaries are offsets, so slices of
one partition never overlap and together cover exactly the partition's range.

Counts come from segment footers (cached; segments are immutable) and are reported only
when they are exact: every slice covers whole segments.
"""

from __future__ import annotations

from dataclasses import dataclass

from thalweg.errors import InvariantError
from thalweg.flight.read.plan import PartitionRange, ReadPlan
from thalweg.flight.read.tickets import OffsetPosition, ReadTicket
from thalweg.lane.layout import Lane, Segment
from thalweg.lane.read.catalog import LaneCatalog


@dataclass(frozen=True, slots=True)
class EndpointPlan:
    """One endpoint's ticket and what it holds (None where not known exactly)."""

    ticket: ReadTicket
    rows: int | None
    bytes: int | None


def plan_endpoints(catalog: LaneCatalog, plan: ReadPlan, slice_rows: int) -> list[EndpointPlan]:
    """The endpoints of ``plan``, in partition then offset order."""
    out: list[EndpointPlan] = []
    for r in plan.ranges:
        if r.end is None or plan.ticket.lane is Lane.DLQ:
            # A follow read (or the small dead-letter lane) is one stream per partition.
            out.append(EndpointPlan(_ticket(plan.ticket, r.partition, None, None), None, None))
            continue
        out.extend(_slices(catalog, plan, r, slice_rows))
    return out


def _slices(
    catalog: LaneCatalog, plan: ReadPlan, r: PartitionRange, slice_rows: int
) -> list[EndpointPlan]:
    if r.end is None:
        raise InvariantError("r.end is not set")
    topic = plan.ticket.topic
    segments = catalog.segments_between(topic, r.partition, r.start, r.end)
    if r.end <= r.start or not segments:
        return [EndpointPlan(_ticket(plan.ticket, r.partition, r.start, r.end), 0, 0)]
    groups: list[list[Segment]] = [[]]
    held = 0
    for seg in segments:
        if groups[-1] and held >= slice_rows:
            groups.append([])
            held = 0
        groups[-1].append(seg)
        held += catalog.segment_stats(seg.path)[0]
    decoded = plan.ticket.lane is Lane.DECODED
    out = []
    for i, group in enumerate(groups):
        lo = r.start if i == 0 else group[0].first
        hi = r.end if i == len(groups) - 1 else groups[i + 1][0].first
        whole = lo <= group[0].first and hi > group[-1].last
        rows = nbytes = None
        if whole and plan.ticket.filter is None:
            rows, nbytes = 0, 0
            for seg in group:
                path = catalog.twin(Lane.DECODED, topic, r.partition, seg) if decoded else seg.path
                try:
                    n, b = catalog.segment_stats(path)
                except OSError:  # a twin removed by repair while we looked
                    rows = nbytes = None
                    break
                rows, nbytes = rows + n, nbytes + b
            if plan.ticket.columns is not None and rows is not None:
                nbytes = None  # a projection weighs less than the files; unknown how much
        out.append(EndpointPlan(_ticket(plan.ticket, r.partition, lo, hi), rows, nbytes))
    return out


def _ticket(t: ReadTicket, partition: int, start: int | None, end: int | None) -> ReadTicket:
    update: dict[str, object] = {"partitions": [partition]}
    if start is not None:
        update["start"] = OffsetPosition(offset=start)
    if end is not None:
        update["end"] = OffsetPosition(offset=end)
    return t.model_copy(update=update)
