"""What one partition has fetched but not yet made durable."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from thalweg.codecs.base import ArrowDecoder, DecodeFailure
from thalweg.config.models import RawLaneConfig
from thalweg.engine.accumulate import ArrowSink, BatchSink, OffsetSpan, RawSink, TeeSink
from thalweg.records.columns import MetadataColumns


@dataclass(frozen=True, slots=True)
class Pending:
    """A segment's worth of records, taken out of the buffer to be written."""

    raw: pa.Table
    decoded: pa.Table | None
    span: OffsetSpan
    nbytes: int
    failures: tuple[DecodeFailure, ...] = ()  # rows of ``decoded`` that did not decode


@dataclass(slots=True)
class PartitionBuffer:
    """The batch sink of one partition plus its positions.

    Positions are "next offset" values: ``durable`` is the exclusive end of the durable
    lane, ``committed`` what the group has committed. Invariant: committed <= durable.
    ``lock`` serialises a push (which decodes on a worker thread) with taking a segment.
    """

    topic: str
    partition: int
    durable: int | None
    committed: int | None
    sink: BatchSink[Any]
    arrow: ArrowSink | None
    in_flight_bytes: int = 0
    in_flight_rows: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    ended: bool = False  # the source returned the partition's last record

    @classmethod
    def create(
        cls,
        topic: str,
        partition: int,
        *,
        durable: int | None,
        committed: int | None,
        columns: MetadataColumns,
        decoder: ArrowDecoder | None,
    ) -> PartitionBuffer:
        if decoder is None:
            return cls(topic, partition, durable, committed, RawSink(columns, durable), None)
        arrow = ArrowSink(columns, decoder, durable)
        sink = TeeSink(RawSink(columns, durable), arrow, durable)
        return cls(topic, partition, durable, committed, sink, arrow)

    def due(self, now: float, cfg: RawLaneConfig) -> bool:
        """True when the buffer should become a segment."""
        s = self.sink
        return not s.empty and (
            self.ended
            or s.rows >= cfg.roll_rows
            or s.nbytes >= cfg.roll_bytes
            or now - s.opened_at >= cfg.roll_age_s
        )

    def take(self) -> Pending:
        nbytes = self.buffered_bytes
        out, span = self.sink.finish()
        raw, decoded = out if self.arrow is not None else (out, None)
        failures = self.arrow.emitted_failures if self.arrow is not None else ()
        self.in_flight_bytes += nbytes
        self.in_flight_rows += raw.num_rows
        return Pending(raw, decoded, span, nbytes, failures)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the records not yet taken: the raw batches and, with a decoded lane,
        their decoded copies (as large as the raw ones, or larger: both are held until
        the segment is written, and ``max_buffered_bytes`` bounds them together)."""
        decoded = self.arrow.decoded_bytes if self.arrow is not None else 0
        return self.sink.nbytes + decoded

    @property
    def held_bytes(self) -> int:
        """Bytes received and not yet durable: buffered plus being written."""
        return self.buffered_bytes + self.in_flight_bytes

    @property
    def held_rows(self) -> int:
        """Records received and not yet durable (a count, whatever the transport's
        positions look like)."""
        return self.sink.rows + self.in_flight_rows
