"""Accumulators: collect raw-lane batches of one partition, emit one representation
(raw, decoded Arrow, Python values, or a tee of two) with the span it covers.

A template method: :class:`BatchSink` tracks the span (first/last offset, the positions
covered including skipped offsets, rows, bytes, age) once; subclasses only say how a
batch is kept and emitted. ``finish()`` returns ``(output, span)`` and starts over.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

import pyarrow as pa

from thalweg.codecs.base import ArrowDecoder, DecodeFailure, DecodeResult
from thalweg.pipeline.decode import decode_batch
from thalweg.records.columns import MetadataColumns, MetadataPolicy
from thalweg.records.convert import values_from_tables

T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")


@dataclass(frozen=True, slots=True)
class OffsetSpan:
    """What a finished batch covers. ``covers_to`` is the position to commit."""

    topic: str
    partition: int
    first: int
    last: int
    covers_from: int
    covers_to: int
    records: int


class BatchSink(ABC, Generic[T]):
    """Accumulates raw-lane batches of one partition; emits ``T`` with its span.

    Args:
        columns: metadata column names.
        position: the next position expected (the resume position), so a first batch
            that starts later (skipped offsets) still covers from here.
    """

    def __init__(self, columns: MetadataColumns, position: int | None = None) -> None:
        self.columns = columns
        self._next = position
        self._reset_span()

    def _reset_span(self) -> None:
        self._topic: str | None = None
        self._partition = -1
        self._first: int | None = None
        self._last = -1
        self._from: int | None = None
        self.rows = 0
        self.nbytes = 0
        self.opened_at = 0.0

    def push(self, raw: pa.RecordBatch) -> None:
        """Add one raw-lane batch (offsets ascending, after everything pushed so far)."""
        if raw.num_rows == 0:
            return
        offsets = raw.column(self.columns.position)
        first, last = int(offsets[0].as_py()), int(offsets[-1].as_py())
        if self._first is None:
            self._topic = str(raw.column(self.columns.topic)[0].as_py())
            self._partition = int(raw.column(self.columns.partition)[0].as_py())
            self._first = first
            self._from = self._next if self._next is not None else first
            self.opened_at = time.monotonic()
        self._last = last
        self._next = last + 1
        self.rows += raw.num_rows
        self.nbytes += raw.nbytes
        self._add(raw)

    @property
    def empty(self) -> bool:
        return self._first is None

    def finish(self) -> tuple[T, OffsetSpan]:
        """Emit what was pushed and its span, then start a new batch."""
        if self._first is None or self._topic is None or self._from is None:
            raise ValueError("finish() on an empty sink")
        span = OffsetSpan(
            self._topic,
            self._partition,
            self._first,
            self._last,
            self._from,
            self._last + 1,
            self.rows,
        )
        out = self._emit()
        self._reset_span()
        self._clear()
        return out, span

    @abstractmethod
    def _add(self, raw: pa.RecordBatch) -> None: ...

    @abstractmethod
    def _emit(self) -> T: ...

    @abstractmethod
    def _clear(self) -> None: ...


class RawSink(BatchSink[pa.Table]):
    """Payload bytes plus every metadata column: the raw lane."""

    def __init__(self, columns: MetadataColumns, position: int | None = None) -> None:
        self._batches: list[pa.RecordBatch] = []
        super().__init__(columns, position)

    def _add(self, raw: pa.RecordBatch) -> None:
        self._batches.append(raw)

    def _emit(self) -> pa.Table:
        if self._batches[0].num_columns == len(self.columns.raw_schema):
            return pa.Table.from_batches(self._batches, schema=self.columns.raw_schema)
        # File rows: the payload column rides along to the writer, which takes the
        # dead letters' bytes from it (lane.writer); its type may widen batch to batch.
        tables = [pa.Table.from_batches([b]) for b in self._batches]
        return pa.concat_tables(tables, promote_options="permissive")

    def _clear(self) -> None:
        self._batches = []


class ArrowSink(BatchSink[pa.Table]):
    """Decoded payload columns + locator + decode error, one row per raw row.

    Decodes on ``push`` so a caller (the live tail) can use each batch's decoded rows at
    once: :attr:`last` and :attr:`last_result`.
    """

    def __init__(
        self, columns: MetadataColumns, decoder: ArrowDecoder, position: int | None = None
    ) -> None:
        self._decoder = decoder
        self._tables: list[pa.Table] = []
        self._failures: list[DecodeFailure] = []
        self._decoded_rows = 0
        self.last: pa.Table | None = None
        self.last_result: DecodeResult | None = None
        self.decoded_bytes = 0  # what the decoded tables hold (nbytes counts the raw input)
        # The failed rows of the last emitted table (row = its index there), reasons typed:
        # the dead-letter lane is written from these, not from the error column's text.
        self.emitted_failures: tuple[DecodeFailure, ...] = ()
        super().__init__(columns, position)

    def _add(self, raw: pa.RecordBatch) -> None:
        self.last, self.last_result = decode_batch(self._decoder, raw, self.columns)
        self._tables.append(self.last)
        self.decoded_bytes += self.last.nbytes
        base = self._decoded_rows
        self._failures.extend(replace(f, row=f.row + base) for f in self.last_result.failures)
        self._decoded_rows += raw.num_rows

    def _emit(self) -> pa.Table:
        self.emitted_failures = tuple(self._failures)
        # Later batches may know more fields (the schema only grows): unify by name.
        return pa.concat_tables(self._tables, promote_options="permissive")

    def _clear(self) -> None:
        self._tables = []
        self._failures = []
        self._decoded_rows = 0
        self.decoded_bytes = 0


class ValueSink(BatchSink[list[dict[str, Any]]]):
    """Record-at-a-time dicts: payload fields, metadata under ``row[prefix]``."""

    def __init__(
        self,
        columns: MetadataColumns,
        decoder: ArrowDecoder | None = None,
        policy: MetadataPolicy = MetadataPolicy.LOCATOR,
        position: int | None = None,
    ) -> None:
        self._arrow = ArrowSink(columns, decoder, position) if decoder is not None else None
        self._raw = RawSink(columns, position)
        self._fields = [f.name for f in columns.metadata_fields(policy)]
        super().__init__(columns, position)

    def _add(self, raw: pa.RecordBatch) -> None:
        self._raw.push(raw)
        if self._arrow is not None:
            self._arrow.push(raw)

    def _emit(self) -> list[dict[str, Any]]:
        raw, _ = self._raw.finish()
        decoded = self._arrow.finish()[0] if self._arrow is not None else None
        return values_from_tables(raw, decoded, self.columns, self._fields)

    def _clear(self) -> None:
        pass  # the inner sinks reset in finish()


class TeeSink(BatchSink[tuple[A, B]]):
    """Two representations of the same records, e.g. raw bytes for replay + Arrow."""

    def __init__(self, a: BatchSink[A], b: BatchSink[B], position: int | None = None) -> None:
        if not (a.empty and b.empty):
            raise ValueError("tee sinks must start empty")
        self.a, self.b = a, b
        super().__init__(a.columns, position)

    def _add(self, raw: pa.RecordBatch) -> None:
        self.a.push(raw)
        self.b.push(raw)

    def _emit(self) -> tuple[A, B]:
        (out_a, span_a), (out_b, span_b) = self.a.finish(), self.b.finish()
        if (span_a.first, span_a.last, span_a.records) != (
            span_b.first,
            span_b.last,
            span_b.records,
        ):
            raise AssertionError(f"tee spans differ: {span_a} != {span_b}")
        return out_a, out_b

    def _clear(self) -> None:
        pass  # the inner sinks reset in finish()
