"""What one partition fetched since its last segment: raw batches, their decoded rows
and decode failures, and the span of positions they cover.

Accumulating is all this does. Decoding is a stage of its own that the runner calls on
a worker thread for a whole fetch at once (``pipeline.decode.decode_batches``: one
decoder call for every partition of a topic, not one each); each partition's share
arrives here already decoded. The span — first and last position, where the covered
range starts (the resume position, so skipped offsets before the first record are
covered too), rows, bytes, age — is tracked once for both lanes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pyarrow as pa

from thalweg.codecs.base import DecodeFailure
from thalweg.lane.read.shape import concat_decoded
from thalweg.records.columns import MetadataColumns


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


@dataclass(frozen=True, slots=True)
class Accumulated:
    """Everything added since the last finish, as tables, with its span."""

    raw: pa.Table
    decoded: pa.Table | None
    failures: tuple[DecodeFailure, ...]  # rows of ``decoded`` that did not decode
    span: OffsetSpan


class Accumulator:
    """Raw-lane batches of one partition (and, for a decoded topic, their decoded rows).

    Args:
        columns: metadata column names.
        position: the next position expected (the resume position), so a first batch
            that starts later (skipped offsets) still covers from here.
        decoded: whether every batch comes with its decoded rows.
    """

    def __init__(
        self, columns: MetadataColumns, position: int | None = None, *, decoded: bool = False
    ) -> None:
        self.columns = columns
        self.decodes = decoded
        self._next = position
        self._start()

    def _start(self) -> None:
        self._topic: str | None = None
        self._partition = -1
        self._first: int | None = None
        self._last = -1
        self._from: int | None = None
        self._raw: list[pa.RecordBatch] = []
        self._decoded: list[pa.Table] = []
        self._failures: list[DecodeFailure] = []
        self.rows = 0
        self.nbytes = 0  # raw-lane bytes added
        self.decoded_bytes = 0  # what the decoded tables hold
        self.opened_at = 0.0

    @property
    def empty(self) -> bool:
        return self._first is None

    def add(
        self,
        raw: pa.RecordBatch,
        decoded: pa.Table | None = None,
        failures: Sequence[DecodeFailure] = (),
        decoded_bytes: int | None = None,
        raw_bytes: int | None = None,
    ) -> None:
        """Add one raw-lane batch (positions ascending, after everything added so far)
        and, for a decoded topic, its decoded rows (one per raw row) and failures (rows
        indexed within this batch). The bytes each holds are measured here unless given
        (the decode stage measures them off the event loop)."""
        if raw.num_rows == 0:
            return
        if self.decodes != (decoded is not None):
            raise ValueError("a decoded topic's batches come with their decoded rows")
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
        self._raw.append(raw)
        if decoded is not None:
            base = self.rows
            self._failures.extend(replace(f, row=f.row + base) for f in failures)
            self._decoded.append(decoded)
            self.decoded_bytes += decoded.nbytes if decoded_bytes is None else decoded_bytes
        self.rows += raw.num_rows
        self.nbytes += raw.nbytes if raw_bytes is None else raw_bytes

    def finish(self) -> Accumulated:
        """What was added, as tables with its span; then start over."""
        if self._first is None or self._topic is None or self._from is None:
            raise ValueError("finish() on an empty accumulator")
        span = OffsetSpan(
            self._topic,
            self._partition,
            self._first,
            self._last,
            self._from,
            self._last + 1,
            self.rows,
        )
        decoded = concat_decoded(self._decoded) if self.decodes else None
        out = Accumulated(self._raw_table(), decoded, tuple(self._failures), span)
        self._start()
        return out

    def _raw_table(self) -> pa.Table:
        if self._raw[0].num_columns == len(self.columns.raw_schema):
            return pa.Table.from_batches(self._raw, schema=self.columns.raw_schema)
        # File rows: the payload column rides along to the writer, which takes the
        # dead letters' bytes from it (lane.writer); its type may widen batch to batch.
        tables = [pa.Table.from_batches([b]) for b in self._raw]
        return pa.concat_tables(tables, promote_options="permissive")
