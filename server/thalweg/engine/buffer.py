"""What one partition has fetched but not yet made durable."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from thalweg.config.models import RawLaneConfig


@dataclass(frozen=True, slots=True)
class Pending:
    """A segment's worth of batches, taken out of the buffer to be written."""

    raws: list[pa.RecordBatch]
    decoded: list[pa.Table]
    covers_from: int
    covers_to: int
    nbytes: int


@dataclass(slots=True)
class PartitionBuffer:
    """Rolling buffer of one partition plus its three positions.

    Positions are "next offset" values: ``durable`` is the exclusive end of the durable
    lane, ``committed`` what the group has committed. Invariant: committed <= durable.
    """

    topic: str
    partition: int
    durable: int | None
    committed: int | None
    next_pos: int | None = None
    covers_from: int | None = None
    raws: list[pa.RecordBatch] = field(default_factory=list)
    decoded: list[pa.Table] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0
    in_flight_bytes: int = 0
    opened_at: float = 0.0

    def __post_init__(self) -> None:
        self.next_pos = self.durable

    def append(
        self, raw: pa.RecordBatch, decoded: pa.Table | None, first: int, last: int, now: float
    ) -> None:
        if not self.raws:
            self.opened_at = now
            self.covers_from = self.next_pos if self.next_pos is not None else first
        self.raws.append(raw)
        if decoded is not None:
            self.decoded.append(decoded)
        self.rows += raw.num_rows
        self.nbytes += raw.nbytes
        self.next_pos = last + 1

    def due(self, now: float, cfg: RawLaneConfig) -> bool:
        """True when the buffer should become a segment."""
        return bool(self.raws) and (
            self.rows >= cfg.roll_rows
            or self.nbytes >= cfg.roll_bytes
            or now - self.opened_at >= cfg.roll_age_s
        )

    def take(self) -> Pending:
        assert self.raws
        assert self.covers_from is not None
        assert self.next_pos is not None
        pending = Pending(self.raws, self.decoded, self.covers_from, self.next_pos, self.nbytes)
        self.in_flight_bytes += self.nbytes
        self.raws, self.decoded, self.rows, self.nbytes = [], [], 0, 0
        self.covers_from = None
        return pending

    @property
    def held_bytes(self) -> int:
        return self.nbytes + self.in_flight_bytes
