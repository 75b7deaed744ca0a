"""Between the raw-lane Arrow form and :class:`RawRecord` / Value dicts.

The raw lane is the source of truth; these conversions are exact inverses for every
field a :class:`RawRecord` carries (``tests/unit/records/test_record_model.py`` checks both the
round trip and that no column is left without a field).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from thalweg.records.columns import TIMESTAMP_TYPES, MetadataColumns
from thalweg.records.model import (
    BatchContext,
    Locator,
    PulsarFields,
    RawRecord,
    Timestamp,
    TimestampType,
)
from thalweg.records.position import pack_message_id


def position_of(locator: Locator) -> int:
    """A record's lane position: its Kafka offset, else its packed Pulsar message id."""
    if locator.offset is not None:
        return locator.offset
    if locator.ledger_id is None or locator.entry_id is None:
        raise ValueError(f"locator {locator} has neither an offset nor a message id")
    return pack_message_id(
        locator.ledger_id,
        locator.entry_id,
        locator.batch_index if locator.batch_index is not None else -1,
    )


# raw-lane source column suffix -> how it is read from a RawRecord.
SOURCE_FIELDS: dict[str, str] = {
    "cluster": "locator.cluster",
    "topic": "locator.topic",
    "partition": "locator.partition",
    "offset": "locator.offset",
    "message_id": "locator.message_id",
    "ledger_id": "locator.ledger_id",
    "entry_id": "locator.entry_id",
    "batch_index": "locator.batch_index",
    "key": "key",
    "ordering_key": "pulsar.ordering_key",
    "value": "value",
    "headers": "headers",
    "timestamp": "timestamp.ms",
    "timestamp_type": "timestamp.type",
    "publish_time": "pulsar.publish_time_ms",
    "event_time": "pulsar.event_time_ms",
    "leader_epoch": "batch.leader_epoch",
    "producer_id": "batch.producer_id",
    "producer_epoch": "batch.producer_epoch",
    "sequence": "batch.sequence",
    "is_transactional": "batch.is_transactional",
    "producer_name": "pulsar.producer_name",
    "redelivery_count": "pulsar.redelivery_count",
}


def records_from_batch(
    batch: pa.RecordBatch | pa.Table, columns: MetadataColumns
) -> list[RawRecord]:
    """Every row of a raw-lane batch as a :class:`RawRecord`."""
    src = {}
    for s in SOURCE_FIELDS:
        col = batch.column(columns.source(s))
        if pa.types.is_timestamp(col.type):
            # Epoch milliseconds as ints: a datetime cannot hold every Kafka timestamp.
            col = col.cast(pa.int64())
        src[s] = col.to_pylist()
    out = []
    for i in range(batch.num_rows):

        def g(suffix: str, i: int = i) -> Any:
            return src[suffix][i]

        out.append(
            RawRecord(
                key=g("key"),
                value=g("value"),
                headers=tuple((h["key"], h["value"]) for h in g("headers")),
                timestamp=Timestamp(
                    g("timestamp") or 0,
                    TimestampType(TIMESTAMP_TYPES.index(g("timestamp_type") or "CreateTime")),
                ),
                locator=Locator(
                    g("cluster"),
                    g("topic"),
                    g("partition"),
                    g("offset"),
                    g("message_id"),
                    g("ledger_id"),
                    g("entry_id"),
                    g("batch_index"),
                ),
                batch=BatchContext(
                    g("leader_epoch"),
                    g("producer_id"),
                    g("producer_epoch"),
                    g("sequence"),
                    g("is_transactional"),
                ),
                pulsar=PulsarFields(
                    g("ordering_key"),
                    g("publish_time"),
                    g("event_time"),
                    g("producer_name"),
                    g("redelivery_count"),
                ),
            )
        )
    return out


def batch_from_records(
    records: list[RawRecord],
    columns: MetadataColumns,
    *,
    record_ids: pa.Array,
    ingest_ts_us: int,
) -> pa.RecordBatch:
    """The raw-lane form of ``records`` (record ids and ingest time supplied by the caller)."""
    data: dict[str, list[Any]] = {columns.source(s): [] for s in SOURCE_FIELDS}
    for r in records:
        row = {
            "cluster": r.locator.cluster,
            "topic": r.locator.topic,
            "partition": r.locator.partition,
            "offset": r.locator.offset,
            "message_id": r.locator.message_id,
            "ledger_id": r.locator.ledger_id,
            "entry_id": r.locator.entry_id,
            "batch_index": r.locator.batch_index,
            "key": r.key,
            "ordering_key": r.pulsar.ordering_key,
            "value": r.value,
            "headers": [{"key": k, "value": v} for k, v in r.headers],
            "timestamp": r.timestamp.ms,
            "timestamp_type": TIMESTAMP_TYPES[r.timestamp.type],
            "publish_time": r.pulsar.publish_time_ms,
            "event_time": r.pulsar.event_time_ms,
            "leader_epoch": r.batch.leader_epoch,
            "producer_id": r.batch.producer_id,
            "producer_epoch": r.batch.producer_epoch,
            "sequence": r.batch.sequence,
            "is_transactional": r.batch.is_transactional,
            "producer_name": r.pulsar.producer_name,
            "redelivery_count": r.pulsar.redelivery_count,
        }
        for s, v in row.items():
            data[columns.source(s)].append(v)
    data[columns.record_id] = record_ids.to_pylist()
    data[columns.position] = [position_of(r.locator) for r in records]
    data[columns.stamped("ingest_ts")] = [ingest_ts_us] * len(records)
    arrays = [
        pa.array(data[f.name], f.type)
        if f.name != columns.stamped("ingest_ts")
        else pa.array(data[f.name], pa.int64()).view(f.type)
        for f in columns.raw_schema
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=columns.raw_schema)


def _plain(col: pa.Array | pa.ChunkedArray) -> list[Any]:
    """Python values of a metadata column; timestamps as integers since the epoch in the
    column's unit (a ``datetime`` cannot hold every timestamp Kafka allows)."""
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.int64())
    values: list[Any] = col.to_pylist()
    return values


def values_from_tables(
    raw: pa.Table, decoded: pa.Table | None, columns: MetadataColumns, policy_fields: list[str]
) -> list[dict[str, Any]]:
    """The Value lane: one dict per record, payload fields at the top level and the
    metadata in a reserved sibling mapping under the prefix (``row["_twg_"]``), keyed by
    column name without the prefix. ``policy_fields`` are the metadata columns to keep.
    Metadata timestamps are integers since the epoch (ms for source times, µs for
    ``ingest_ts``/``emit_ts``)."""
    payload = (
        decoded.drop_columns([n for n in decoded.column_names if columns.is_reserved(n)])
        if decoded is not None
        else None
    )
    rows: list[dict[str, Any]] = (
        payload.to_pylist() if payload is not None else [{} for _ in range(raw.num_rows)]
    )
    meta_cols = {
        name: _plain(raw.column(name)) for name in policy_fields if name in raw.column_names
    }
    if decoded is not None and columns.decode_error in policy_fields:
        meta_cols[columns.decode_error] = decoded.column(columns.decode_error).to_pylist()
    cut = len(columns.prefix)
    for i, row in enumerate(rows):
        row[columns.prefix] = {name[cut:]: col[i] for name, col in meta_cols.items()}
    return rows
