"""What one partition has fetched but not yet made durable."""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field, replace
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

    def split(self, roll: RawLaneConfig, position: str) -> list[Pending]:
        """This segment cut into pieces of at most the roll limits (rows and raw bytes),
        in offset order, each covering up to where the next begins.

        One fetch may bring more than a segment's worth (a backlog, an upstream serving
        whole segments, a partition whose writes waited on a full disk); written as one,
        the segment would be larger than an operator sized it, and retention, which
        never removes a partition's newest segment, could not make room below it.
        """
        rows = self.raw.num_rows
        pieces = max(
            math.ceil(rows / roll.roll_rows), math.ceil(self.raw.nbytes / roll.roll_bytes), 1
        )
        pieces = min(pieces, rows)
        if pieces <= 1:
            return [self]
        size = math.ceil(rows / pieces)
        offsets = self.raw.column(position)
        out: list[Pending] = []
        covers_from = self.span.covers_from
        taken_bytes = 0
        for start in range(0, rows, size):
            n = min(size, rows - start)
            end = start + n
            last_piece = end == rows
            first = int(offsets[start].as_py())
            last = int(offsets[end - 1].as_py())
            covers_to = self.span.covers_to if last_piece else last + 1
            span = replace(
                self.span,
                first=first,
                last=last,
                covers_from=covers_from,
                covers_to=covers_to,
                records=n,
            )
            nbytes = self.nbytes - taken_bytes if last_piece else self.nbytes * n // rows
            taken_bytes += nbytes
            failures = tuple(
                replace(f, row=f.row - start) for f in self.failures if start <= f.row < end
            )
            decoded = self.decoded.slice(start, n) if self.decoded is not None else None
            out.append(Pending(self.raw.slice(start, n), decoded, span, nbytes, failures))
            covers_from = covers_to
        return out


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
    # Pieces of a take larger than the roll limits, written before anything newer.
    rest: deque[Pending] = field(default_factory=deque)

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
        if self.rest:
            return True
        s = self.sink
        return not s.empty and (
            self.ended
            or s.rows >= cfg.roll_rows
            or s.nbytes >= cfg.roll_bytes
            or now - s.opened_at >= cfg.roll_age_s
        )

    @property
    def empty(self) -> bool:
        """Nothing buffered (what is being written aside)."""
        return self.sink.empty and not self.rest

    def take(self, roll: RawLaneConfig) -> Pending:
        """The next segment to write: at most the roll limits, oldest records first."""
        if not self.rest:
            nbytes = self.sink.nbytes + (self.arrow.decoded_bytes if self.arrow else 0)
            out, span = self.sink.finish()
            raw, decoded = out if self.arrow is not None else (out, None)
            failures = self.arrow.emitted_failures if self.arrow is not None else ()
            whole = Pending(raw, decoded, span, nbytes, failures)
            self.rest.extend(whole.split(roll, self.sink.columns.position))
        pending = self.rest.popleft()
        self.in_flight_bytes += pending.nbytes
        self.in_flight_rows += pending.raw.num_rows
        return pending

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the records not yet taken: the raw batches and, with a decoded lane,
        their decoded copies (as large as the raw ones, or larger: both are held until
        the segment is written, and ``max_buffered_bytes`` bounds them together)."""
        decoded = self.arrow.decoded_bytes if self.arrow is not None else 0
        return self.sink.nbytes + decoded + sum(p.nbytes for p in self.rest)

    @property
    def held_bytes(self) -> int:
        """Bytes received and not yet durable: buffered plus being written."""
        return self.buffered_bytes + self.in_flight_bytes

    @property
    def held_rows(self) -> int:
        """Records received and not yet durable (a count, whatever the transport's
        positions look like)."""
        waiting: int = sum(p.raw.num_rows for p in self.rest)
        return self.sink.rows + waiting + self.in_flight_rows
