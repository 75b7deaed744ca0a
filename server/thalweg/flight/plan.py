"""Resolve a ticket into per-partition position ranges and an output schema."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from thalweg.errors import TicketError
from thalweg.flight.tickets import End, OffsetPosition, ReadTicket, Start, TimestampPosition
from thalweg.lane.catalog import LaneCatalog
from thalweg.lane.layout import Lane
from thalweg.lane.shape import decoded_schema


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """Positions ``[start, end)`` of one partition; ``end`` None means follow."""

    partition: int
    start: int
    end: int | None


@dataclass(frozen=True, slots=True)
class ReadPlan:
    ticket: ReadTicket
    schema: pa.Schema
    payload_schema: pa.Schema
    ranges: tuple[PartitionRange, ...]


def output_schema(catalog: LaneCatalog, ticket: ReadTicket) -> tuple[pa.Schema, pa.Schema]:
    """The stream schema and the payload part of it."""
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
    return decoded_schema(payload, catalog.columns, ticket.metadata), payload


def plan_read(catalog: LaneCatalog, ticket: ReadTicket) -> ReadPlan:
    """Fix positions and schema at call time (``now`` means now, not when read)."""
    if ticket.topic not in catalog.topics():
        raise TicketError(f"unknown topic {ticket.topic!r}")
    known = catalog.partitions(ticket.topic)
    wanted = known if ticket.partitions is None else sorted(set(ticket.partitions))
    missing = [p for p in wanted if p not in known]
    if missing:
        raise TicketError(
            f"topic {ticket.topic!r} has no partition {missing[0]} "
            f"(known: {', '.join(map(str, known)) or 'none yet'})"
        )
    schema, payload = output_schema(catalog, ticket)
    ranges = []
    for p in wanted:
        durable = catalog.durable_end(ticket.topic, p)
        start = _start(catalog, ticket.topic, p, ticket.start, durable)
        end = _end(catalog, ticket.topic, p, ticket.end, durable)
        ranges.append(PartitionRange(p, start, end))
    return ReadPlan(ticket, schema, payload, tuple(ranges))


def _start(catalog: LaneCatalog, topic: str, p: int, start: Start, durable: int) -> int:
    if start == "earliest":
        return 0
    if start == "latest":
        return catalog.high_water(topic, p)
    if isinstance(start, OffsetPosition):
        return start.offset
    assert isinstance(start, TimestampPosition)
    found = catalog.reader.offset_for_timestamp(topic, p, start.timestamp_ms, durable)
    return durable if found is None else found


def _end(catalog: LaneCatalog, topic: str, p: int, end: End, durable: int) -> int | None:
    if end == "now":
        return durable
    if end == "follow":
        return None
    if isinstance(end, OffsetPosition):
        return end.offset
    assert isinstance(end, TimestampPosition)
    found = catalog.reader.offset_for_timestamp(topic, p, end.timestamp_ms, durable)
    return durable if found is None else found
