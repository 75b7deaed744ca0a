"""The decoder protocol shared by every payload format."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from thalweg.codecs.limits import SchemaLimits, Shape, check
from thalweg.errors import InvariantError
from thalweg.records.columns import MetadataColumns


class DecodeReason(StrEnum):
    """Why one record did not make it into the decoded lane: its dead-letter reason,
    and the ``reason`` label of the failure metric.

    Most are decode failures (stage ``decode``); ``contract`` and ``quality`` are a data
    contract's verdict on a record that decoded (stage ``contract``); ``oversize`` and
    ``retry_exhausted`` are records the decoder was never given.
    """

    EMPTY = "empty"  # zero-length or whitespace-only payload
    SYNTAX = "syntax"  # not parseable in the format
    NOT_ONE_RECORD = "not_one_record"  # parsed to zero or several records, or not an object
    TYPE_CONFLICT = "type_conflict"  # parses, but a field's type contradicts the lane schema
    RESERVED_FIELD = "reserved_field"  # a payload field uses the metadata prefix
    BAD_FRAMING = "bad_framing"  # no Confluent header: too short or wrong magic byte
    UNKNOWN_SCHEMA = "unknown_schema"  # the registry does not know the schema id
    SCHEMA_CONFLICT = "schema_conflict"  # the writer schema contradicts the lane schema
    UNSUPPORTED = "unsupported"  # the schema uses a type the type map does not cover yet
    OVERSIZE = "oversize"  # larger than the source's max_record_bytes: not decoded
    RETRY_EXHAUSTED = "retry_exhausted"  # its schema stayed unreachable past the retry bound
    CONTRACT = "contract"  # decoded, but breaks the data contract's schema (ODCS)
    QUALITY = "quality"  # decoded, but breaks one of the contract's quality rules
    SCHEMA_LIMIT = "schema_limit"  # would take the lane schema past a SchemaLimits bound
    ENVELOPE = "envelope"  # a change event (envelope = "debezium") that names no row

    @property
    def stage(self) -> str:
        """The pipeline stage that refused the record (the dead-letter ``stage``)."""
        return "contract" if self in (DecodeReason.CONTRACT, DecodeReason.QUALITY) else "decode"


@dataclass(frozen=True, slots=True)
class DecodeFailure:
    """One row that did not decode."""

    row: int
    reason: DecodeReason
    message: str


@dataclass(frozen=True, slots=True)
class DecodeResult:
    """Decoded payload columns, one row per input payload.

    Attributes:
        table: payload columns; rows that failed (or were null tombstones) are all-null.
        errors: ``string`` array, one entry per row, null where the row decoded.
        failures: the failed rows with reasons, for metrics and dead-letter routing.
    """

    table: pa.Table
    errors: pa.StringArray
    failures: tuple[DecodeFailure, ...]


class ArrowDecoder(Protocol):
    """Decodes a batch of payloads straight to Arrow (no per-record Python objects)."""

    @property
    def schema(self) -> pa.Schema:
        """The lane schema so far: every payload field seen, in first-seen order."""
        ...

    def decode(self, values: pa.Array) -> DecodeResult:
        """Decode ``values`` (``binary``, nulls are tombstones) into aligned rows."""
        ...


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Give ``table`` exactly ``schema``: drop extra columns, add missing ones as nulls,
    and promote types (int → double, narrower → wider structs) the permissive way."""
    keep = [name for name in table.column_names if schema.get_field_index(name) >= 0]
    merged = pa.concat_tables(
        [schema.empty_table(), table.select(keep)], promote_options="permissive"
    ).select(schema.names)
    return merged if merged.schema == schema else merged.cast(schema)


def admit(
    lane: pa.Schema,
    group: pa.Schema,
    rows: Sequence[int] | npt.NDArray[np.integer[Any]],
    label: str,
    columns: MetadataColumns,
    limits: tuple[SchemaLimits, Shape] | None = None,
) -> tuple[pa.Schema | None, list[DecodeFailure]]:
    """Whether one writer schema's rows may join the lane.

    Returns the widened lane schema, or None with a failure per row when the writer
    schema contradicts the lane (``schema_conflict``), names a reserved field, or would
    take the lane past ``limits`` (the limits and the lane's shape when the batch began:
    ``schema_limit``).
    """
    reserved = [name for name in group.names if columns.is_reserved(name)]
    if reserved:
        msg = f"payload field {reserved[0]!r} uses the reserved metadata prefix {columns.prefix!r}"
        return None, [DecodeFailure(int(r), DecodeReason.RESERVED_FIELD, msg) for r in rows]
    try:
        widened = pa.unify_schemas([lane, group], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        msg = f"{label} does not evolve the lane schema compatibly: {exc}"
        return None, [DecodeFailure(int(r), DecodeReason.SCHEMA_CONFLICT, msg) for r in rows]
    if limits is not None and not widened.equals(lane):
        why = check(limits[0], limits[1], widened)
        if why is not None:
            msg = f"{label}: {why}"
            return None, [DecodeFailure(int(r), DecodeReason.SCHEMA_LIMIT, msg) for r in rows]
    return widened, []


def assemble(
    n: int,
    lane: pa.Schema,
    pieces: Sequence[tuple[npt.NDArray[np.int64], pa.Table]],
    failures: Sequence[DecodeFailure],
) -> DecodeResult:
    """One row per input: each piece's rows where they came from, nulls elsewhere."""
    tables = [conform(t, lane) for _, t in pieces]
    merged = pa.concat_tables(tables) if tables else lane.empty_table()
    take = np.full(n, -1, dtype=np.int64)
    if pieces:
        rows = np.concatenate([r for r, _ in pieces])
        take[rows] = np.arange(len(rows))
    if failures:  # a row can parse and still fail later (a reserved field): it stays null
        take[np.array([f.row for f in failures], dtype=np.int64)] = -1
    table = merged.take(pa.array(take, mask=take < 0))
    messages: list[str | None] = [None] * n
    for f in failures:
        messages[f.row] = f"{f.reason.value}: {f.message}"
    errors = pa.array(messages, pa.string())
    if not isinstance(errors, pa.StringArray):
        raise InvariantError("errors is not a pa.StringArray")
    return DecodeResult(table, errors, tuple(sorted(failures, key=lambda f: f.row)))


class ValueDecoder:
    """Record-at-a-time decoding (bytes → dict) over an :class:`ArrowDecoder`.

    The same schema resolution as the columnar path — it *is* the columnar path on a
    one-row batch — so the two can never disagree. For consumers that want one record.
    """

    def __init__(self, decoder: ArrowDecoder) -> None:
        self._decoder = decoder

    def decode(self, payload: bytes | None) -> dict[str, Any] | None:
        """The payload's fields; None for a tombstone.

        Raises:
            DecodeError: the payload does not decode (the message says why).
        """
        from thalweg.errors import DecodeError

        if payload is None:
            return None
        result = self._decoder.decode(pa.array([payload], pa.binary()))
        if result.failures:
            f = result.failures[0]
            raise DecodeError(f"{f.reason.value}: {f.message}")
        row: dict[str, Any] = result.table.to_pylist()[0]
        return row


class LaneDecoder(ABC):
    """What every format's decoder shares: the lane schema so far, the limits on how it
    may grow, and one decode at a time (the schema only grows, and a decode reads and
    widens it)."""

    def __init__(
        self,
        columns: MetadataColumns,
        schema: pa.Schema | None = None,
        limits: SchemaLimits | None = None,
    ) -> None:
        self._columns = columns
        self._schema = schema if schema is not None else pa.schema([])
        self._limits = limits if limits is not None else SchemaLimits()
        self._shape = (self._schema, Shape.of(self._schema))
        self._lock = threading.Lock()

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def limits(self) -> SchemaLimits:
        return self._limits

    @property
    def shape(self) -> Shape:
        """The lane schema's :class:`Shape` (computed once per schema)."""
        if self._shape[0] is not self._schema:
            self._shape = (self._schema, Shape.of(self._schema))
        return self._shape[1]

    def decode(self, values: pa.Array) -> DecodeResult:
        with self._lock:
            return self._decode(values)

    @abstractmethod
    def _decode(self, values: pa.Array) -> DecodeResult:
        """Decode one batch; called under the lock."""
