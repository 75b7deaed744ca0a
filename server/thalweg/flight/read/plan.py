"""Resolve a ticket into per-partition position ranges and an output schema."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from thalweg.errors import InvariantError, TicketError
from thalweg.flight.errors import UnavailableError
from thalweg.flight.read.tickets import End, OffsetPosition, ReadTicket, Start, TimestampPosition
from thalweg.lane.layout import Lane
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.lane.read.shape import decoded_schema


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """Positions ``[start, end)`` of one partition; ``end`` None means follow."""

    partition: int
    start: int
    end: int | None


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """A resolved read. ``full_schema`` is what the lane gives before projection;
    ``schema`` what the stream sends; ``predicate`` the ticket's filter, if any."""

    ticket: ReadTicket
    schema: pa.Schema
    payload_schema: pa.Schema
    ranges: tuple[PartitionRange, ...]
    full_schema: pa.Schema
    predicate: pc.Expression | None = None

    @property
    def shape_schema(self) -> pa.Schema:
        """What a segment read is shaped to before ``finish``: the full schema's fields
        the stream sends or filters by. Shaping to the full schema made null columns
        for every metadata field a projected read then dropped (a tenth of a latest
        view's read)."""
        if self.ticket.columns is None:
            return self.full_schema
        needed = {*self.ticket.columns, *(c.column for c in self.ticket.filter or [])}
        return pa.schema([f for f in self.full_schema if f.name in needed])

    def finish(self, table: pa.Table) -> pa.Table:
        """Filter, then project, a shaped table (exact whatever the source pushed down)."""
        if self.predicate is not None:
            table = table.filter(self.predicate)
        return table.select(self.schema.names) if table.schema != self.schema else table


def build_predicate(ticket: ReadTicket, schema: pa.Schema) -> pc.Expression | None:
    """The ticket's filter as an Arrow expression; refuses unknown columns and values of
    the wrong type for the column."""
    if not ticket.filter:
        return None
    expr: pc.Expression | None = None
    for cond in ticket.filter:
        if schema.get_field_index(cond.column) < 0:
            raise TicketError(f"filter column {cond.column!r} is not in the read's schema")
        col = pc.field(cond.column)
        if cond.op == "is_null":
            term = col.is_null()
        elif cond.op == "is_valid":
            term = col.is_valid()
        else:
            t = schema.field(cond.column).type
            try:
                if cond.op == "in":
                    if not isinstance(cond.value, list):
                        raise TicketError(f"filter 'in' on {cond.column!r} needs a list")
                    term = col.isin(pa.array(cond.value, t))
                else:
                    value = pa.scalar(cond.value, t)
                    term = {
                        "==": col == value,
                        "!=": col != value,
                        "<": col < value,
                        "<=": col <= value,
                        ">": col > value,
                        ">=": col >= value,
                    }[cond.op]
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
                raise TicketError(
                    f"filter value for {cond.column!r} does not fit {t}: {exc}"
                ) from exc
        expr = term if expr is None else expr & term
    return expr


def output_schema(catalog: LaneCatalog, ticket: ReadTicket) -> tuple[pa.Schema, pa.Schema]:
    """The lane's stream schema (before projection) and the payload part of it."""
    if ticket.lane is Lane.RAW:
        return catalog.columns.raw_schema, pa.schema([])
    if ticket.lane is Lane.DLQ:
        if ticket.end == "follow":
            raise TicketError("the dlq lane is history only: use a bounded end")
        return catalog.columns.dlq_schema, pa.schema([])
    if not catalog.has_decoded(ticket.topic):
        raise TicketError(
            f"topic {ticket.topic!r} has no decoded lane (its source has format = 'none'); "
            "read lane 'raw'"
        )
    payload = catalog.payload_schema(ticket.topic)
    if not len(payload) and ticket.end == "follow":
        # A stream's schema is fixed when it starts; an empty one would carry no rows.
        raise TicketError(
            f"topic {ticket.topic!r} has no decoded columns yet, and a follow stream needs "
            "them up front: retry once its first record is decoded, or follow lane 'raw'"
        )
    return decoded_schema(payload, catalog.columns, ticket.metadata), payload


def answered_schema(catalog: LaneCatalog, ticket: ReadTicket) -> pa.Schema:
    """The schema a read of ``ticket`` sends, checked as :func:`plan_read` checks it but
    with no positions fixed: what a view that reads other columns to answer with these
    (the latest view's fold) asks first, so its one read is planned once.

    Raises:
        TicketError: as :func:`plan_read`.
    """
    return _checked(catalog, ticket)[2]


def plan_read(
    catalog: LaneCatalog, ticket: ReadTicket, elsewhere: Callable[[int], bool] | None = None
) -> ReadPlan:
    """Fix positions and schema at call time (``now`` means now, not when read).

    A bounded read never waits: an ``end`` offset beyond what the partition holds when
    the call starts (its durable end and live tail) is answered up to there. Partitions
    ``elsewhere`` says another gateway serves are planned but not checked against this
    lane (their owner resolves the ticket again).
    """
    full, payload, schema, wanted = _checked(catalog, ticket)
    predicate = build_predicate(ticket, full)
    ranges = []
    for p in wanted:
        durable = catalog.durable_end(ticket.topic, p)
        start = _start(catalog, ticket.topic, p, ticket.start, durable)
        end = _end(catalog, ticket.topic, p, ticket.end, durable)
        if end is not None and end < start:
            # Nothing to read: an empty range at the start (an endpoint ticket that parses,
            # and never below a retention floor — a replica whose copy of a lane lags its
            # floor has a durable end below it).
            end = start
        if elsewhere is None or not elsewhere(p):
            _check_held(catalog, ticket.topic, p, start, end)
        ranges.append(PartitionRange(p, start, end))
    return ReadPlan(ticket, schema, payload, tuple(ranges), full, predicate)


def _checked(
    catalog: LaneCatalog, ticket: ReadTicket
) -> tuple[pa.Schema, pa.Schema, pa.Schema, list[int]]:
    """The ticket checked against the catalog: (the lane's full schema, its payload
    part, the schema sent, the partitions read)."""
    catalog.prepare(ticket.topic)
    if ticket.topic not in catalog.topics():
        raise TicketError(f"unknown topic {ticket.topic!r}")
    known = catalog.partitions(ticket.topic)
    wanted = known if ticket.partitions is None else sorted(set(ticket.partitions))
    missing = [p for p in wanted if p not in known]
    if missing and catalog.awaiting_assignment(ticket.topic):
        # Restarted into a running group: the others already send readers here.
        raise UnavailableError(
            f"topic {ticket.topic!r}: partition {missing[0]} is not known yet — this "
            "gateway's consumer-group assignment has not arrived; retry"
        )
    if missing:
        raise TicketError(
            f"topic {ticket.topic!r} has no partition {missing[0]} "
            f"(known: {', '.join(map(str, known)) or 'none yet'})"
        )
    if ticket.sink is not None and ticket.sink not in (sinks := catalog.dead_letter_sinks()):
        # Read as an empty lane, a typo would look like a sink that refused nothing.
        raise TicketError(
            f"no sink {ticket.sink!r} (the sinks whose refused records can be read: "
            f"{', '.join(sinks) or 'none'})"
        )
    full, payload = output_schema(catalog, ticket)
    schema = full
    if ticket.columns is not None:
        unknown = [c for c in ticket.columns if full.get_field_index(c) < 0]
        if unknown:
            raise TicketError(f"column {unknown[0]!r} is not in the read's schema")
        schema = pa.schema([full.field(c) for c in ticket.columns])
    return full, payload, schema, wanted


def start_of_new_partition(catalog: LaneCatalog, ticket: ReadTicket, p: int) -> int:
    """Where a follow stream over all partitions starts one that appeared after it began:
    at its beginning — every record in it is newer than the stream — unless the ticket
    named an offset or a timestamp, which holds for it as for the others."""
    if ticket.start in ("earliest", "latest"):
        return 0
    return _start(catalog, ticket.topic, p, ticket.start, catalog.durable_end(ticket.topic, p))


def _start(catalog: LaneCatalog, topic: str, p: int, start: Start, durable: int) -> int:
    if start == "earliest":
        return catalog.earliest(topic, p)  # what retention keeps
    if start == "latest":
        return catalog.high_water(topic, p)
    if isinstance(start, OffsetPosition):
        _check_retained(catalog, topic, p, start.offset)
        return start.offset
    if not isinstance(start, TimestampPosition):
        raise InvariantError("start is not a TimestampPosition")
    found = catalog.position_at(topic, p, start.timestamp_ms, durable)
    return durable if found is None else found


def _check_retained(catalog: LaneCatalog, topic: str, p: int, offset: int) -> None:
    """An offset below the retention floor is read only while its file is still on disk
    (an endpoint planned before the floor rose); once it is gone, the read is refused
    rather than answered from the floor on.

    Raises:
        TicketError: the offset's segment was removed by retention.
    """
    if not catalog.still_held(topic, p, offset):
        raise TicketError(
            f"{topic}[{p}]: offset {offset} was removed by retention; the earliest "
            f"available is {catalog.earliest(topic, p)}"
        )


def _check_held(catalog: LaneCatalog, topic: str, p: int, start: int, end: int | None) -> None:
    """Refuse a range that crosses positions another replica's ``data_dir`` holds
    (lane/read/elsewhere.py): answering around them would be a silently partial read.

    Raises:
        TicketError: naming the skipped offsets and where this lane resumes.
    """
    if end is not None and end <= start:
        return
    gap = catalog.held_elsewhere(topic, p, start, end)
    if gap is None:
        return
    lo, hi = gap
    raise TicketError(
        f"{topic}[{p}]: offsets {lo}-{hi - 1} are not in this gateway's data_dir — another "
        "replica of the consumer group ingested them into its own (docs/operations.md, "
        f"scale-out). This gateway holds {topic}[{p}] from offset {hi}; read the rest "
        "from the replica that holds it, or give every replica one shared data_dir"
    )


def _end(catalog: LaneCatalog, topic: str, p: int, end: End, durable: int) -> int | None:
    if end == "now":
        return durable
    if end == "follow":
        return None
    if isinstance(end, OffsetPosition):
        # Answered up to what the gateway holds when the call starts, never waited for.
        return min(end.offset, catalog.high_water(topic, p))
    if not isinstance(end, TimestampPosition):
        raise InvariantError("end is not a TimestampPosition")
    found = catalog.position_at(topic, p, end.timestamp_ms, durable)
    return durable if found is None else found
