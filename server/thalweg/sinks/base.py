"""What every destination besides the raw lane is: the ``Sink`` contract.

The raw lane is primary and holds the source commit; a sink is secondary (ADR-0012 in
the seed plan): it never holds the source back, and its progress is what it reports
durable. So the contract is small and exact — ``write`` Arrow batches that carry the
``_twg_`` locator columns, ``flush`` to make them durable and answer with exactly which
positions landed, ``close``, and ``health`` — plus one typed signal,
:class:`SinkBackpressureError`, for a destination that needs the engine to slow down
(it says when to retry). Concrete sinks (Iceberg, Postgres, Arrow IPC, Flight) are
chosen by ``kind`` through the loader in ``thalweg.sinks``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

import pyarrow as pa

from thalweg.errors import ThalwegError

PartitionKey = tuple[str, int]


class SinkBackpressureError(ThalwegError):
    """The destination cannot take more now; retry the same batch after
    ``retry_after_s`` (nothing of it was written)."""

    retriable = True

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SinkState(StrEnum):
    UP = "up"
    DEGRADED = "degraded"
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class SinkHealth:
    """A sink's entry in /health (never gating readiness: the raw lane is primary)."""

    state: SinkState
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Landed:
    """What one flush made durable: per (topic, partition), half-open position ranges.

    Ranges, not a high-water mark: a sink may land positions out of order (a retried
    batch, a replay from the raw lane), and coverage must never claim a gap.
    """

    ranges: dict[PartitionKey, list[tuple[int, int]]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not any(self.ranges.values())


class Sink(ABC):
    """One configured destination.

    Args:
        name: the ``[[sinks]] name``, used in metrics and /health.
    """

    kind: ClassVar[str]

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    async def write(self, batch: pa.RecordBatch) -> None:
        """Accept ``batch`` (with its ``_twg_`` locator columns); not yet durable.

        Raises:
            SinkBackpressureError: not accepted now; retry after the given delay.
        """

    @abstractmethod
    async def flush(self) -> Landed:
        """Make everything written so far durable; exactly the positions that landed."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections; what was not flushed is not durable."""

    @abstractmethod
    def health(self) -> SinkHealth:
        """The sink's state now, for /health."""
