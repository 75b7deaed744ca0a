"""aiokafka's fetcher handing over columns instead of one object per record.

aiokafka keeps a fetch response's bytes and unpacks them record by record when the
consumer asks (``PartitionRecords``). A consumer built with a :class:`ColumnarFetch` as
its value deserializer gets, instead of ``ConsumerRecord`` objects, one
:class:`~thalweg.kafka.unpack.KafkaColumns` per record batch, decoded in bulk
(:mod:`thalweg.kafka.unpack`). Everything else is aiokafka's: the fetch requests,
positions, seeks, pauses, rebalances, and the rules this class repeats batch by batch
— CRC checks, control batches skipped, aborted transactions dropped under
``read_committed``, records before the fetch position skipped. Other consumers in the
process see no change: the replacement class behaves as aiokafka's unless the marker is
there.

This leans on two names inside ``aiokafka.consumer.fetcher`` (``PartitionRecords`` and
``MemoryRecords``), so the aiokafka version is pinned to the minor release it was
written against, and ``tests/integration/test_columnar_fetch.py`` fails if the shape changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiokafka.consumer.fetcher as _fetcher
import numpy as np
import pyarrow as pa
from aiokafka.errors import CorruptRecordException
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord
from aiokafka.record.legacy_records import LegacyRecordBatch

from thalweg.kafka.unpack import (
    LOG_OVERHEAD,
    MAGIC_AT,
    BatchHeader,
    CorruptRecordError,
    KafkaColumns,
    check_crc,
    decode_batches,
    decode_records,
    records_section,
)
from thalweg.records.raw_batch import build_headers

_READ_COMMITTED = 1
_PartitionRecords: Any = _fetcher.PartitionRecords
_MemoryRecords: Any = _fetcher.MemoryRecords


class ColumnarFetch:
    """The marker a consumer is built with (as its ``value_deserializer``), and the
    record budget of its next ``getmany(max_records=1)``: a batch larger than
    ``remaining`` is handed over in parts, the rest kept for the next call (never fetched
    twice)."""

    def __init__(self) -> None:
        self.remaining = 0

    def __call__(self, value: bytes | None) -> bytes | None:
        return value  # never called on the columnar path; harmless if it is


class _KeptMemoryRecords:
    """aiokafka's ``MemoryRecords`` that keeps the fetched bytes for the columnar path."""

    __slots__ = ("_inner", "raw")

    def __init__(self, data: bytes) -> None:
        self.raw = data
        self._inner = _MemoryRecords(data)

    def size_in_bytes(self) -> int:
        return int(self._inner.size_in_bytes())

    def has_next(self) -> bool:
        return bool(self._inner.has_next())

    def next_batch(self) -> Any:
        return self._inner.next_batch()


class _ColumnarPartitionRecords(_PartitionRecords):  # type: ignore[misc]
    next_fetch_offset: int

    def __init__(
        self,
        tp: Any,
        records: Any,
        aborted_transactions: Any,
        fetch_offset: int,
        key_deserializer: Any,
        value_deserializer: Any,
        check_crcs: bool,
        isolation_level: int,
    ) -> None:
        super().__init__(
            tp,
            records,
            aborted_transactions,
            fetch_offset,
            key_deserializer,
            value_deserializer,
            check_crcs,
            isolation_level,
        )
        if isinstance(value_deserializer, ColumnarFetch) and isinstance(
            records, _KeptMemoryRecords
        ):
            self._records_iterator = self._unpack_columns(records.raw, value_deserializer)

    def _unpack_columns(self, raw: bytes, budget: ColumnarFetch) -> Iterator[KafkaColumns]:
        """The fetched batches as columns: each run of consecutive record batches is
        decoded at once (``decode_batches``: the fixed cost of a decode once per run, not
        once per batch — small batches are common), then handed over in parts of at most
        the budget."""
        view = memoryview(raw)
        pos, end = 0, len(raw)
        run: list[tuple[bytes | memoryview, BatchHeader]] = []
        while end - pos >= LOG_OVERHEAD + 5:
            length = int.from_bytes(view[pos + 8 : pos + 12], "big", signed=True)
            stop = pos + LOG_OVERHEAD + length
            if stop > end:
                break  # a partial batch at the end of a fetch: fetched again whole
            batch = view[pos:stop]
            pos = stop
            magic = batch[MAGIC_AT]
            if magic < 2:
                yield from self._hand_over(run, budget)
                run = []
                cols = self._legacy(bytes(batch), magic)
                next_offset = int(cols.offsets[-1]) + 1 if len(cols) else self.next_fetch_offset
                yield from self._parts(cols, next_offset, budget)
                continue
            header = BatchHeader.parse(batch)
            if self._check_crcs and not check_crc(batch, header):
                yield from self._hand_over(run, budget)  # what came before is sound
                raise CorruptRecordException(f"Invalid CRC - {self._tp}")
            if self._skipped(batch, header):
                yield from self._hand_over(run, budget)
                run = []
                self.next_fetch_offset = header.next_offset  # as aiokafka's reader
                continue
            run.append((batch, header))
        yield from self._hand_over(run, budget)

    def _hand_over(
        self, run: list[tuple[bytes | memoryview, BatchHeader]], budget: ColumnarFetch
    ) -> Iterator[KafkaColumns]:
        """A run of batches, decoded as one, in parts of at most the budget."""
        if not run:
            return
        try:
            groups = [(decode_batches(run), run[-1][1])]
        except CorruptRecordError:
            # Batch by batch: the sound ones before the corrupt one are handed over, and
            # the error names the batch, as when every batch was decoded alone.
            groups = []
            for batch, header in run:
                try:
                    groups.append((decode_records(records_section(batch, header), header), header))
                except CorruptRecordError as exc:  # raised as aiokafka raises a bad CRC
                    for cols, last in groups:
                        yield from self._parts(cols, last.next_offset, budget)
                    raise CorruptRecordException(
                        f"{self._tp} at offset {header.base_offset}: {exc}"
                    ) from exc
        for cols, last in groups:
            yield from self._parts(cols, last.next_offset, budget)

    def _parts(
        self, cols: KafkaColumns, next_offset: int, budget: ColumnarFetch
    ) -> Iterator[KafkaColumns]:
        cols = cols.since(self.next_fetch_offset)
        while len(cols):
            # At least one record, so a fetch always makes progress.
            take = max(1, min(len(cols), budget.remaining))
            part, cols = cols.head(take), cols.drop(take)
            budget.remaining -= take
            # aiokafka moves the consumer's position to this when it takes the part.
            self.next_fetch_offset = int(cols.offsets[0]) if len(cols) else next_offset
            yield part
        self.next_fetch_offset = max(next_offset, self.next_fetch_offset)

    def _skipped(self, batch: memoryview, header: BatchHeader) -> bool:
        """A control batch, or a batch of an aborted transaction under read_committed —
        the same decisions as aiokafka's ``_unpack_records``."""
        if self._isolation_level == _READ_COMMITTED and header.producer_id != -1:
            self._consume_aborted_up_to(header.base_offset)
            if header.is_control and self._is_abort(batch, header):
                self._aborted_producers.discard(header.producer_id)
            if header.is_transactional and header.producer_id in self._aborted_producers:
                return True
        return header.is_control

    @staticmethod
    def _is_abort(batch: memoryview, header: BatchHeader) -> bool:
        cols = decode_records(records_section(batch, header), header)
        if not len(cols):
            raise CorruptRecordException("Control batch did not contain any records")
        return bool(ControlRecord.parse(cols.keys[0].as_py()) == ABORT_MARKER)

    def _legacy(self, batch: bytes, magic: int) -> KafkaColumns:
        """A message set of format v0/v1 (brokers before 0.11), through aiokafka's reader."""
        records = list(LegacyRecordBatch(bytearray(batch), magic))
        n = len(records)
        return KafkaColumns(
            np.fromiter((r.offset for r in records), np.int64, count=n),
            np.fromiter((r.timestamp or -1 for r in records), np.int64, count=n),
            np.fromiter((r.timestamp_type or 0 for r in records), np.int8, count=n),
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
            build_headers([r.headers for r in records]),
        )


def install() -> None:
    """Put the columnar-capable classes into aiokafka's fetcher (once; idempotent)."""
    _fetcher.PartitionRecords = _ColumnarPartitionRecords
    _fetcher.MemoryRecords = _KeptMemoryRecords


install()
