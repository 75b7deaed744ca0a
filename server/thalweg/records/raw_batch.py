"""Turn one fetched group of records of a partition into a raw-lane RecordBatch.

This is the hot path: it runs once per fetched record group, so every column is built
with one bulk call (``map(attrgetter)`` → ``pa.array``) rather than a Python loop per
record. Measured shape: about 1 M rows/s per column on this class of machine
(``docs/performance.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Sized
from itertools import chain
from operator import attrgetter
from typing import NamedTuple, Protocol

import numpy as np
import pyarrow as pa

from thalweg.records.columns import (
    HEADER_TYPE,
    SOURCE_COLUMNS,
    TIMESTAMP_MS,
    TIMESTAMP_TYPES,
    TIMESTAMP_US,
    MetadataColumns,
)
from thalweg.records.record_id import record_ids


class KafkaLikeRecord(Protocol):
    """The fields of a fetched Kafka record we read (aiokafka's ConsumerRecord fits)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def timestamp_type(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str | bytes, bytes | None]]: ...


_TS_TYPE_DICT = pa.array(TIMESTAMP_TYPES, pa.string())
_HEADER_STRUCT = HEADER_TYPE.value_type
_EMPTY_HEADER_VALUES = pa.array([], _HEADER_STRUCT)
_get_offset = attrgetter("offset")
_get_ts = attrgetter("timestamp")
_get_ts_type = attrgetter("timestamp_type")
_get_key = attrgetter("key")
_get_value = attrgetter("value")
_get_headers = attrgetter("headers")


def _header_key(key: str | bytes) -> bytes:
    return key.encode("utf-8") if isinstance(key, str) else key


def assemble_headers(
    rows: Sequence[Sized], flat: Callable[[], tuple[pa.Array, pa.Array]]
) -> pa.Array:
    """``list<struct<key, value>>`` from each row's pairs (only their count is read here)
    and ``flat()``: every key and every value in row order, asked for only when there
    is at least one pair."""
    counts = np.fromiter(map(len, rows), dtype=np.int32, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    if offsets[-1] == 0:
        values = _EMPTY_HEADER_VALUES
    else:
        keys, vals = flat()
        values = pa.StructArray.from_arrays([keys, vals], fields=list(_HEADER_STRUCT))
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=HEADER_TYPE)


def build_headers(headers: list[Sequence[tuple[str | bytes, bytes | None]]]) -> pa.Array:
    """``list<struct<key, value>>`` keeping order, duplicate keys and null values."""

    def flat() -> tuple[pa.Array, pa.Array]:
        pairs = list(chain.from_iterable(headers))
        keys = pa.array([_header_key(k) for k, _ in pairs], pa.binary())
        return keys, pa.array([v for _, v in pairs], pa.binary())

    return assemble_headers(headers, flat)


def constant(value: object, type_: pa.DataType, n: int) -> pa.Array:
    """An array of ``n`` copies of ``value`` without a Python list of length ``n``."""
    return pa.repeat(pa.scalar(value, type_), n)


def build_raw_batch(
    records: Sequence[KafkaLikeRecord],
    *,
    cluster: str,
    ingest_ts_us: int,
    columns: MetadataColumns,
) -> pa.RecordBatch:
    """Build the raw-lane batch for records of one (topic, partition), in offset order.

    Args:
        records: fetched records of a single partition.
        cluster: the source's cluster name (part of the record id).
        ingest_ts_us: when the batch was received, in µs since the epoch (one value for
            the whole batch: it is the time Thalweg took custody).
        columns: the metadata column names in use.
    """
    n = len(records)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=columns.raw_schema)
    return raw_batch_from_columns(
        topic=records[0].topic,
        partition=records[0].partition,
        offsets=np.fromiter(map(_get_offset, records), dtype=np.int64, count=n),
        timestamps_ms=np.fromiter(map(_get_ts, records), dtype=np.int64, count=n),
        timestamp_types=np.fromiter(map(_get_ts_type, records), dtype=np.int8, count=n),
        keys=pa.array(list(map(_get_key, records)), pa.binary()),
        values=pa.array(list(map(_get_value, records)), pa.binary()),
        headers=build_headers(list(map(_get_headers, records))),
        cluster=cluster,
        ingest_ts_us=ingest_ts_us,
        columns=columns,
    )


def raw_batch_from_columns(
    *,
    topic: str,
    partition: int,
    offsets: np.ndarray,
    timestamps_ms: np.ndarray,
    timestamp_types: np.ndarray,
    keys: pa.Array,
    values: pa.Array,
    headers: pa.Array,
    cluster: str,
    ingest_ts_us: int,
    columns: MetadataColumns,
) -> pa.RecordBatch:
    """The raw-lane batch of records of one (topic, partition) given as columns (a
    columnar fetch, :mod:`thalweg.kafka.unpack`; or :func:`build_raw_batch`'s columns
    read from record objects), in offset order."""
    n = len(offsets)
    offsets_arr = pa.array(offsets, pa.int64())
    built: dict[str, pa.Array] = {
        "cluster": constant(cluster, pa.string(), n),
        "topic": constant(topic, pa.string(), n),
        "partition": constant(partition, pa.int32(), n),
        "offset": offsets_arr,
        "key": keys,
        "value": values,
        "headers": headers,
        "timestamp": pa.array(timestamps_ms, pa.int64()).view(TIMESTAMP_MS),
        "timestamp_type": _TS_TYPE_DICT.take(pa.array(timestamp_types, pa.int8())),
    }
    arrays = [
        built[suffix] if suffix in built else pa.nulls(n, type_) for suffix, type_ in SOURCE_COLUMNS
    ]
    arrays.append(record_ids(cluster, topic, partition, offsets))
    arrays.append(offsets_arr)  # a Kafka record's position is its offset
    arrays.append(constant(ingest_ts_us, TIMESTAMP_US, n))
    return pa.RecordBatch.from_arrays(arrays, schema=columns.raw_schema)


class PartitionColumns(NamedTuple):
    """One partition's fetched records as columns, in offset order."""

    topic: str
    partition: int
    offsets: np.ndarray
    timestamps_ms: np.ndarray
    timestamp_types: np.ndarray
    keys: pa.Array
    values: pa.Array
    headers: pa.Array


def raw_batches_from_columns(
    parts: Sequence[PartitionColumns],
    *,
    cluster: str,
    ingest_ts_us: int,
    columns: MetadataColumns,
) -> list[pa.RecordBatch]:
    """The raw-lane batch of each partition of one fetch, built as one batch and sliced.

    Building a batch costs some twenty-five array constructions whatever its rows; a
    fetch over 32 partitions of a few records each spent a third of the event loop
    building them one by one. Built together, a fetch pays once; each partition's
    batch is a zero-copy slice of the whole.
    """
    small = [i for i, p in enumerate(parts) if len(p.offsets) < JOINT_ROWS]
    out: list[pa.RecordBatch | None] = [None] * len(parts)
    if len(small) > 1:
        joint = _joint([parts[i] for i in small], cluster, ingest_ts_us, columns)
        for i, batch in zip(small, joint, strict=True):
            out[i] = batch
    for i, p in enumerate(parts):
        if out[i] is None:
            out[i] = raw_batch_from_columns(
                **p._asdict(), cluster=cluster, ingest_ts_us=ingest_ts_us, columns=columns
            )
    return [b for b in out if b is not None]


#: Partitions that brought fewer records than this in a fetch share one built batch;
#: larger ones get their own (a slice keeps its whole batch alive: a partition's
#: segments should not pin the others' rows).
JOINT_ROWS = 4096


def _joint(
    parts: Sequence[PartitionColumns], cluster: str, ingest_ts_us: int, columns: MetadataColumns
) -> list[pa.RecordBatch]:
    counts = np.array([len(p.offsets) for p in parts], np.int64)
    n = int(counts.sum())
    offsets = np.concatenate([p.offsets for p in parts])
    topics = sorted({p.topic for p in parts})
    topic_index = np.repeat(np.array([topics.index(p.topic) for p in parts], np.int32), counts)
    partitions = np.repeat(np.array([p.partition for p in parts], np.int32), counts)
    offsets_arr = pa.array(offsets, pa.int64())
    built: dict[str, pa.Array] = {
        "cluster": constant(cluster, pa.string(), n),
        "topic": pa.array(topics, pa.string()).take(pa.array(topic_index)),
        "partition": pa.array(partitions, pa.int32()),
        "offset": offsets_arr,
        "key": pa.concat_arrays([p.keys for p in parts]),
        "value": pa.concat_arrays([p.values for p in parts]),
        "headers": pa.concat_arrays([p.headers for p in parts]),
        "timestamp": pa.array(np.concatenate([p.timestamps_ms for p in parts]), pa.int64()).view(
            TIMESTAMP_MS
        ),
        "timestamp_type": _TS_TYPE_DICT.take(
            pa.array(np.concatenate([p.timestamp_types for p in parts]), pa.int8())
        ),
    }
    arrays = [
        built[suffix] if suffix in built else pa.nulls(n, type_) for suffix, type_ in SOURCE_COLUMNS
    ]
    arrays.append(
        pa.concat_arrays([record_ids(cluster, p.topic, p.partition, p.offsets) for p in parts])
    )
    arrays.append(offsets_arr)  # a Kafka record's position is its offset
    arrays.append(constant(ingest_ts_us, TIMESTAMP_US, n))
    whole = pa.RecordBatch.from_arrays(arrays, schema=columns.raw_schema)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return [whole.slice(int(a), int(c)) for a, c in zip(starts, counts, strict=True)]
