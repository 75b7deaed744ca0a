"""What one partition has fetched but not yet made durable."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa

from thalweg.codecs.base import DecodeFailure
from thalweg.config.models import RawLaneConfig
from thalweg.engine.ingest.accumulate import Accumulator, OffsetSpan
from thalweg.lane.read.shape import concat_decoded
from thalweg.records.columns import MetadataColumns


@dataclass(frozen=True, slots=True)
class Pending:
    """A segment's worth of records, taken out of the buffer to be written."""

    raw: pa.Table
    decoded: pa.Table | None
    span: OffsetSpan
    nbytes: int  # what the records hold in memory: raw and decoded
    raw_bytes: int  # the raw rows' share of it (what ``roll_bytes`` bounds)
    failures: tuple[DecodeFailure, ...] = ()  # rows of ``decoded`` that did not decode

    @property
    def rows(self) -> int:
        return int(self.raw.num_rows)

    def cut(self, n: int, position: str) -> tuple[Pending, Pending]:
        """The first ``n`` rows and the rest (``0 < n < rows``): the first covers up to
        where the rest begins, the rest to where this ended."""
        rows = self.rows
        offsets = self.raw.column(position)
        head_last, tail_first = int(offsets[n - 1].as_py()), int(offsets[n].as_py())
        head_span = replace(self.span, last=head_last, covers_to=head_last + 1, records=n)
        tail_span = replace(
            self.span, first=tail_first, covers_from=head_last + 1, records=rows - n
        )
        head_bytes = self.nbytes * n // rows
        head_raw = self.raw_bytes * n // rows
        decoded = self.decoded
        return (
            Pending(
                self.raw.slice(0, n),
                decoded.slice(0, n) if decoded is not None else None,
                head_span,
                head_bytes,
                head_raw,
                tuple(f for f in self.failures if f.row < n),
            ),
            Pending(
                self.raw.slice(n),
                decoded.slice(n) if decoded is not None else None,
                tail_span,
                self.nbytes - head_bytes,
                self.raw_bytes - head_raw,
                tuple(replace(f, row=f.row - n) for f in self.failures if f.row >= n),
            ),
        )

    def pinned(self) -> Pending:
        """The same records, charged for the memory they keep alive. A slice holds its
        whole fetched batch: a small carry of a large fetch pins far more than its rows'
        share, which ``max_buffered_bytes`` must count (copying the carry instead cost
        up to 40 % of a ``twg batch`` run: wide rows, ``take`` is no memcpy)."""
        pinned = self.raw.get_total_buffer_size()
        if self.decoded is not None:
            pinned += self.decoded.get_total_buffer_size()
        return replace(self, nbytes=max(self.nbytes, int(pinned)))

    def join(self, later: Pending) -> Pending:
        """This and the records right after it, as one."""
        decoded = None
        if self.decoded is not None and later.decoded is not None:
            decoded = concat_decoded([self.decoded, later.decoded])
        span = replace(
            self.span,
            last=later.span.last,
            covers_to=later.span.covers_to,
            records=self.span.records + later.span.records,
        )
        shifted = tuple(replace(f, row=f.row + self.rows) for f in later.failures)
        return Pending(
            pa.concat_tables([self.raw, later.raw], promote_options="permissive"),
            decoded,
            span,
            self.nbytes + later.nbytes,
            self.raw_bytes + later.raw_bytes,
            self.failures + shifted,
        )


@dataclass(slots=True)
class PartitionBuffer:
    """What one partition fetched and has not yet made durable, plus its positions.

    Positions are "next offset" values: ``durable`` is the exclusive end of the durable
    lane, ``committed`` what the group has committed. Invariant: committed <= durable.
    Used from the event loop only (adding and taking never interleave).
    """

    topic: str
    partition: int
    durable: int | None
    committed: int | None
    acc: Accumulator
    in_flight_bytes: int = 0
    in_flight_rows: int = 0
    ended: bool = False  # the source returned the partition's last record
    # A take is at most a segment's worth (the roll limits). One fetch may bring more
    # (a backlog, an upstream serving whole segments, a partition whose writes waited on
    # a full disk): its further full segments wait in ``rest``, written before anything
    # newer, and what is left past the last full one is ``carry``, the start of the next
    # segment. Written as one file, such a take would be larger than an operator sized
    # segments, and retention, which never removes a partition's newest segment, could
    # not make room below it on a full disk.
    rest: deque[Pending] = field(default_factory=deque)
    carry: Pending | None = None
    carry_opened_at: float = 0.0  # when the carry's oldest record arrived
    # The first segment is due by age this much early. Partitions assigned together
    # would otherwise roll together, every ``roll_age_s``: 32 segments written in one
    # burst stalled the fetch loop and the follow streams for up to two seconds. Spread
    # once, they stay spread (each next segment opens at the first fetch after a take).
    head_start: float = 0.0

    @classmethod
    def create(
        cls,
        topic: str,
        partition: int,
        *,
        durable: int | None,
        committed: int | None,
        columns: MetadataColumns,
        decoded: bool,
        head_start: float = 0.0,
    ) -> PartitionBuffer:
        """An empty buffer; ``decoded``: the topic has a decoded lane, so every batch
        added comes with its decoded rows; ``head_start``: its first segment is due by
        age that much early."""
        acc = Accumulator(columns, durable, decoded=decoded)
        return cls(topic, partition, durable, committed, acc, head_start=head_start)

    @property
    def decodes(self) -> bool:
        return self.acc.decodes

    def add(
        self,
        raw: pa.RecordBatch,
        decoded: pa.Table | None = None,
        failures: Sequence[DecodeFailure] = (),
        decoded_bytes: int | None = None,
        raw_bytes: int | None = None,
    ) -> None:
        """One fetched batch (and, for a decoded topic, its decoded rows and failures);
        the bytes each holds when the decode stage measured them."""
        self.acc.add(raw, decoded, failures, decoded_bytes, raw_bytes)

    def due(self, now: float, cfg: RawLaneConfig) -> bool:
        """True when the buffer should become a segment."""
        if self.rest:
            return True
        if self.acc.empty and self.carry is None:
            return False
        return (
            self.ended
            or self._rows >= cfg.roll_rows
            or self._raw_bytes >= cfg.roll_bytes
            or now - self._opened_at >= cfg.roll_age_s
        )

    @property
    def empty(self) -> bool:
        """Nothing buffered (what is being written aside)."""
        return self.acc.empty and self.carry is None and not self.rest

    def take(self, roll: RawLaneConfig, now: float) -> Pending:
        """The next segment to write, oldest records first: at most the roll limits.

        Past the last full segment's worth, the records stay buffered as the start of
        the next segment — unless the buffer is due by age or the partition ended (or
        ``now`` is ``inf``: everything, a stop or backpressure), when they go too.
        """
        if not self.rest:
            everything = self.ended or now - self._opened_at >= roll.roll_age_s
            opened_at = self._opened_at
            self.head_start = 0.0
            whole = self._whole()
            size = self._segment_rows(whole, roll)
            position = self.acc.columns.position
            while whole.rows > size:
                head, whole = whole.cut(size, position)
                self.rest.append(head)
            if whole.rows == size or everything or not self.rest:
                self.rest.append(whole)
            else:
                self.carry, self.carry_opened_at = whole.pinned(), opened_at
        pending = self.rest.popleft()
        self.in_flight_bytes += pending.nbytes
        self.in_flight_rows += pending.rows
        return pending

    def _whole(self) -> Pending:
        """The carry and everything accumulated since, as one."""
        carry, self.carry = self.carry, None
        if self.acc.empty:
            if carry is None:
                raise ValueError("take() on an empty buffer")
            return carry
        raw_bytes = self.acc.nbytes
        nbytes = raw_bytes + self.acc.decoded_bytes
        got = self.acc.finish()
        fresh = Pending(got.raw, got.decoded, got.span, nbytes, raw_bytes, got.failures)
        return carry.join(fresh) if carry is not None else fresh

    @staticmethod
    def _segment_rows(whole: Pending, roll: RawLaneConfig) -> int:
        """Rows in a full segment: ``roll_rows``, fewer where ``roll_bytes`` comes first
        (at the take's mean raw row size)."""
        raw_bytes = whole.raw_bytes  # counted as batches came: measuring costs milliseconds
        if raw_bytes <= roll.roll_bytes:
            return roll.roll_rows
        by_bytes = max(1, whole.rows * roll.roll_bytes // raw_bytes)
        return min(roll.roll_rows, by_bytes)

    @property
    def _rows(self) -> int:
        return self.acc.rows + (self.carry.rows if self.carry is not None else 0)

    @property
    def _raw_bytes(self) -> int:
        carried = int(self.carry.raw.nbytes) if self.carry is not None else 0
        return self.acc.nbytes + carried

    @property
    def _opened_at(self) -> float:
        opened = self.carry_opened_at if self.carry is not None else self.acc.opened_at
        return opened - self.head_start

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the records not yet taken: the raw batches and, with a decoded lane,
        their decoded copies (as large as the raw ones, or larger: both are held until
        the segment is written, and ``max_buffered_bytes`` bounds them together)."""
        waiting = sum(p.nbytes for p in self.rest)
        carried = self.carry.nbytes if self.carry is not None else 0
        return self.acc.nbytes + self.acc.decoded_bytes + waiting + carried

    @property
    def held_bytes(self) -> int:
        """Bytes received and not yet durable: buffered plus being written."""
        return self.buffered_bytes + self.in_flight_bytes

    @property
    def held_rows(self) -> int:
        """Records received and not yet durable (a count, whatever the transport's
        positions look like)."""
        waiting = sum(p.rows for p in self.rest)
        return self._rows + waiting + self.in_flight_rows


def roll_phase(partition: int) -> float:
    """Where in ``[0, 1)`` of the roll age a partition's segments fall due: evenly
    spread for any number of partitions (the golden-ratio sequence), the same for a
    partition every time."""
    return (partition * 0.6180339887498949) % 1.0
