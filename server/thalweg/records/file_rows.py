"""Raw-lane batches for rows read from files (``twg batch``).

A file row has no payload bytes of its own once a columnar reader has parsed it, so it
travels as typed columns: the raw columns carry its locator — the lane topic, the file's
number as its partition, its row number as its offset and position, the file's URI in
``message_id``, the file's modification time as its timestamp — and an in-memory struct
column (``columns.payload``) carries the row's fields to the decoder. The raw lane
stores the locator; the decoded lane stores the fields; the file itself, identified by
its content hash in the batch manifest, is the bytes. A row the reader could not parse
keeps its text as the value (bytes exactly as in the file) and the reader's message in
the struct's ``file_error`` child, so it reaches the dead-letter lane like any record
that did not decode.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from thalweg.records.columns import (
    HEADER_TYPE,
    SOURCE_COLUMNS,
    TIMESTAMP_MS,
    TIMESTAMP_US,
    MetadataColumns,
)
from thalweg.records.raw_batch import constant
from thalweg.records.record_id import record_ids


@dataclass(frozen=True, slots=True)
class BrokenRow:
    """A row the file's reader could not parse: its number, its bytes, and why."""

    row: int
    text: bytes
    message: str


def file_rows_batch(
    *,
    table: pa.Table,
    rows: npt.NDArray[np.int64],
    broken: Sequence[BrokenRow],
    topic: str,
    partition: int,
    uri: str | pa.Array,
    mtime_ms: int | None,
    cluster: str,
    ingest_ts_us: int,
    columns: MetadataColumns,
) -> pa.RecordBatch:
    """The raw-lane batch (plus the payload column) of one chunk of one file.

    Args:
        table: the rows that parsed, typed, in file order.
        uri: the file's URI, or one message id per row (a Flight source: the upstream
            record ids).
        mtime_ms: the file's modification time (None: no timestamp).
        rows: the row number of each of ``table``'s rows (ascending).
        broken: the rows that did not parse (their numbers are not in ``rows``).
    """
    n_good = table.num_rows
    n = n_good + len(broken)
    err_field = pa.field(columns.file_error, pa.string())
    fields = table.combine_chunks()
    if not broken:  # the common case: no copy of the rows, no Python list of n items
        positions = np.asarray(rows, dtype=np.int64)
        arrays = [c.chunk(0) if c.num_chunks else pa.nulls(0, c.type) for c in fields.columns]
        payload = pa.StructArray.from_arrays(
            [*arrays, pa.nulls(n, pa.string())], fields=[*fields.schema, err_field]
        )
        values = pa.nulls(n, pa.binary())
    else:
        positions = np.concatenate(
            [np.asarray(rows, dtype=np.int64), np.array([b.row for b in broken], dtype=np.int64)]
        )
        sort = np.argsort(positions, kind="stable")
        order = pa.array(sort)
        positions = positions[sort]
        filler = [pa.nulls(len(broken), f.type) for f in fields.schema]
        padded = pa.concat_tables(
            [fields, pa.Table.from_arrays(filler, schema=fields.schema)]
        ).combine_chunks()
        arrays = [c.chunk(0) if c.num_chunks else pa.nulls(0, c.type) for c in padded.columns]
        errors = pa.concat_arrays(
            [pa.nulls(n_good, pa.string()), pa.array([b.message for b in broken], pa.string())]
        )
        payload = pa.StructArray.from_arrays(
            [*arrays, errors], fields=[*fields.schema, err_field]
        ).take(order)
        values = pa.concat_arrays(
            [pa.nulls(n_good, pa.binary()), pa.array([b.text for b in broken], pa.binary())]
        ).take(order)
    offsets = pa.array(positions, pa.int64())
    built: dict[str, pa.Array] = {
        "cluster": _repeated(cluster, pa.string(), n),
        "topic": _repeated(topic, pa.string(), n),
        "partition": _repeated(partition, pa.int32(), n),
        "offset": offsets,
        "message_id": _repeated(uri.encode(), pa.binary(), n) if isinstance(uri, str) else uri,
        "value": values,
        "headers": _no_headers(n),
        "timestamp": _repeated(mtime_ms, TIMESTAMP_MS, n)
        if mtime_ms is not None
        else _nulls(n, TIMESTAMP_MS),
    }
    out = [built[s] if s in built else _nulls(n, t) for s, t in SOURCE_COLUMNS]
    out.append(record_ids(cluster, topic, partition, positions))
    out.append(offsets)
    out.append(constant(ingest_ts_us, TIMESTAMP_US, n))
    out.append(payload)
    schema = pa.schema([*columns.raw_schema, pa.field(columns.payload, payload.type)])
    return pa.RecordBatch.from_arrays(out, schema=schema)


# Chunks of one file are mostly the same size, so the same arrays repeat batch after
# batch; Arrow arrays are immutable, so they are shared (pa.repeat and pa.nulls took a
# third of a file row's cost).
@lru_cache(maxsize=256)
def _repeated(value: object, type_: pa.DataType, n: int) -> pa.Array:
    return constant(value, type_, n)


@lru_cache(maxsize=256)
def _nulls(n: int, type_: pa.DataType) -> pa.Array:
    return pa.nulls(n, type_)


@lru_cache(maxsize=64)
def _no_headers(n: int) -> pa.Array:
    """``n`` empty header lists, from zero offsets (``pa.repeat`` of an empty-list
    scalar takes ~90 ms per 64k rows)."""
    values = pa.array([], HEADER_TYPE.value_type)
    lists = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), values)
    return lists if lists.type == HEADER_TYPE else lists.cast(HEADER_TYPE)


def strip_payload(raw: pa.RecordBatch, columns: MetadataColumns) -> pa.RecordBatch:
    """``raw`` without the in-memory payload column (what the raw lane stores)."""
    i = raw.schema.get_field_index(columns.payload)
    return raw if i < 0 else raw.remove_column(i)


def _json_default(value: object) -> object:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, (dt.date, dt.time, dt.datetime)):
        return value.isoformat()
    return str(value)  # Decimal, timedelta, ...


def row_bytes(dead: pa.Table, columns: MetadataColumns) -> pa.Table:
    """Dead file rows with a value: a row the reader could not parse keeps its text; a
    typed row that parsed (refused later, by a contract or the lane schema) gets its
    fields as one JSON object — bytes are base64, times ISO 8601 — so the dead-letter
    lane holds what was refused. Per row in Python: only dead rows come here."""
    values = dead.column(columns.value).to_pylist()
    payloads = dead.column(columns.payload).to_pylist()
    out: list[bytes | None] = []
    for value, row in zip(values, payloads, strict=True):
        if value is None and row is not None:
            row.pop(columns.file_error, None)
            out.append(json.dumps(row, default=_json_default, ensure_ascii=False).encode())
        else:
            out.append(value)
    i = dead.schema.get_field_index(columns.value)
    return dead.set_column(i, columns.value, pa.array(out, pa.binary()))
