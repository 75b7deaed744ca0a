"""The record-at-a-time model: what a broker handed us, with nothing dropped.

Slotted, frozen dataclasses — cheap to build, never validated per record (the hot path
builds Arrow columns directly and never materialises these; they serve the Value lane,
the produce direction and tests).

``Headers`` is an ordered tuple of ``(key, value)`` pairs, never a mapping: Kafka allows
duplicate keys and null values, and a dict would lose both before any test noticed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

Header = tuple[bytes, bytes | None]
Headers = tuple[Header, ...]


class TimestampType(IntEnum):
    """Who set the timestamp: the producer (CreateTime) or the broker (LogAppendTime)."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


@dataclass(frozen=True, slots=True)
class Timestamp:
    """Milliseconds since the epoch (may be negative or zero), with its type."""

    ms: int
    type: TimestampType = TimestampType.CREATE_TIME


@dataclass(frozen=True, slots=True)
class Locator:
    """Where a record lives. Kafka fills ``offset``; Pulsar the message-id fields."""

    cluster: str
    topic: str
    partition: int
    offset: int | None = None
    message_id: bytes | None = None
    ledger_id: int | None = None
    entry_id: int | None = None
    batch_index: int | None = None


@dataclass(frozen=True, slots=True)
class BatchContext:
    """What the record's batch says about its producer (null where a client hides it)."""

    leader_epoch: int | None = None
    producer_id: int | None = None
    producer_epoch: int | None = None
    sequence: int | None = None
    is_transactional: bool | None = None


@dataclass(frozen=True, slots=True)
class PulsarFields:
    """Fields only Pulsar has; all None for Kafka records."""

    ordering_key: bytes | None = None
    publish_time_ms: int | None = None
    event_time_ms: int | None = None
    producer_name: str | None = None
    redelivery_count: int | None = None


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record exactly as consumed.

    ``key`` and ``value`` keep ``None`` and ``b""`` apart (a null value is a tombstone).
    """

    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: Timestamp
    locator: Locator
    batch: BatchContext = field(default_factory=BatchContext)
    pulsar: PulsarFields = field(default_factory=PulsarFields)
