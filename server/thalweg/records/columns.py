"""The canonical metadata column set: names, Arrow types, and which lane carries what.

This module is the only place a metadata column name or type is spelled. Every other
module asks a :class:`MetadataColumns` instance, so changing the prefix (default
``_twg_``) or adding a column happens here once.

Two families, told apart by name:

* ``<prefix>source_*`` — what the broker handed us. One superset for Kafka and Pulsar; a
  column is null where the transport has no such field.
* ``<prefix>*`` without ``source_`` — what Thalweg stamped (record id, ingest time...).
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import cached_property

import pyarrow as pa

DEFAULT_PREFIX = "_twg_"
_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")

HEADER_TYPE = pa.list_(
    pa.struct([pa.field("key", pa.binary(), nullable=False), pa.field("value", pa.binary())])
)
TIMESTAMP_MS = pa.timestamp("ms", tz="UTC")
TIMESTAMP_US = pa.timestamp("us", tz="UTC")
RECORD_ID_TYPE = pa.binary(16)

# (suffix, type) in lane order. Suffixes are joined to "<prefix>source_".
SOURCE_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("cluster", pa.string()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("message_id", pa.binary()),  # Pulsar: serialized MessageId
    ("ledger_id", pa.int64()),  # Pulsar
    ("entry_id", pa.int64()),  # Pulsar
    ("batch_index", pa.int32()),  # Pulsar
    ("key", pa.binary()),
    ("ordering_key", pa.binary()),  # Pulsar
    ("value", pa.binary()),
    ("headers", HEADER_TYPE),
    ("timestamp", TIMESTAMP_MS),
    ("timestamp_type", pa.string()),
    ("publish_time", TIMESTAMP_MS),  # Pulsar
    ("event_time", TIMESTAMP_MS),  # Pulsar
    ("leader_epoch", pa.int32()),
    ("producer_id", pa.int64()),
    ("producer_epoch", pa.int16()),
    ("sequence", pa.int32()),
    ("is_transactional", pa.bool_()),
    ("producer_name", pa.string()),  # Pulsar
    ("redelivery_count", pa.int32()),  # Pulsar
)

# We-stamped columns of the raw lane. Joined to "<prefix>".
STAMPED_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("record_id", RECORD_ID_TYPE),
    # The lane's order key within a partition: the Kafka offset, or the Pulsar message id
    # packed into an int64 (thalweg.records.position). Never null, whatever the transport.
    ("position", pa.int64()),
    ("ingest_ts", TIMESTAMP_US),
)

# Stamped on the way out (Flight) or by the decoded lane only.
EMIT_TS = ("emit_ts", TIMESTAMP_US)
DECODE_ERROR = ("decode_error", pa.string())

# Dead-letter columns, added to the raw columns of a failed record. Joined to "<prefix>".
DLQ_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("dlq_reason", pa.string()),  # a DecodeReason value: syntax, oversize, contract, ...
    ("dlq_error", pa.string()),  # the error text
    ("dlq_stage", pa.string()),  # where it failed: "decode" or "contract"
    ("dlq_ts", TIMESTAMP_US),  # when it was dead-lettered
)

LOCATOR_SOURCE = ("cluster", "topic", "partition", "offset", "message_id")

TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")


class MetadataPolicy(StrEnum):
    """Which metadata columns a decoded lane carries next to the payload columns."""

    NONE = "none"
    LOCATOR = "locator"
    ALL = "all"


class MetadataColumns:
    """Names and types of the metadata columns under one prefix.

    Args:
        prefix: the reserved prefix; payload fields under it are refused by decoders.
    """

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not _PREFIX_RE.match(prefix):
            raise ValueError(
                f"metadata prefix {prefix!r} must be 1-32 characters of letters, digits "
                "and '_', not starting with a digit"
            )
        self.prefix = prefix

    def source(self, suffix: str) -> str:
        """The name of a source-provided column, e.g. ``source('offset')``."""
        return f"{self.prefix}source_{suffix}"

    def stamped(self, suffix: str) -> str:
        """The name of a we-stamped column, e.g. ``stamped('record_id')``."""
        return f"{self.prefix}{suffix}"

    def is_reserved(self, name: str) -> bool:
        """True when a payload field name collides with the reserved prefix."""
        return name.startswith(self.prefix)

    # Frequently used names, spelled once.
    @cached_property
    def offset(self) -> str:
        return self.source("offset")

    @cached_property
    def position(self) -> str:
        """The per-partition order key every lane is sorted, named and sliced by."""
        return self.stamped("position")

    @cached_property
    def partition(self) -> str:
        return self.source("partition")

    @cached_property
    def topic(self) -> str:
        return self.source("topic")

    @cached_property
    def timestamp(self) -> str:
        return self.source("timestamp")

    @cached_property
    def value(self) -> str:
        return self.source("value")

    @cached_property
    def record_id(self) -> str:
        return self.stamped("record_id")

    @cached_property
    def payload(self) -> str:
        """An in-memory column of a file row's typed fields (a struct), beside the raw
        columns from the file reader to the decoder; never stored in the raw lane."""
        return self.stamped("payload")

    @cached_property
    def file_error(self) -> str:
        """The child of :attr:`payload` naming why the reader could not parse a row."""
        return self.stamped("file_error")

    @cached_property
    def decode_error(self) -> str:
        return self.stamped(DECODE_ERROR[0])

    @cached_property
    def emit_ts(self) -> str:
        return self.stamped(EMIT_TS[0])

    @cached_property
    def raw_schema(self) -> pa.Schema:
        """The raw lane: every source column, then the stamped ones."""
        fields = [pa.field(self.source(s), t) for s, t in SOURCE_COLUMNS]
        fields += [pa.field(self.stamped(s), t) for s, t in STAMPED_COLUMNS]
        return pa.schema(fields)

    @cached_property
    def locator_fields(self) -> list[pa.Field]:
        """What ``MetadataPolicy.LOCATOR`` keeps: where the record came from + its id."""
        raw = self.raw_schema
        names = [self.source(s) for s in LOCATOR_SOURCE] + [self.record_id, self.position]
        return [raw.field(n) for n in names]

    def metadata_fields(self, policy: MetadataPolicy) -> list[pa.Field]:
        """The metadata fields a decoded lane carries under ``policy``.

        ``all`` is the full raw set plus ``emit_ts``; ``locator`` the locator plus the
        decode error column (so a row that failed to decode is visible and attributable);
        ``none`` nothing.
        """
        error = pa.field(self.decode_error, DECODE_ERROR[1])
        if policy is MetadataPolicy.NONE:
            return []
        if policy is MetadataPolicy.LOCATOR:
            return [*self.locator_fields, error]
        return [*self.raw_schema, pa.field(self.emit_ts, EMIT_TS[1]), error]

    @cached_property
    def dlq_schema(self) -> pa.Schema:
        """The dead-letter lane: the full raw record plus why, where and when it failed."""
        return pa.schema(
            [*self.raw_schema, *(pa.field(self.stamped(s), t) for s, t in DLQ_COLUMNS)]
        )

    @cached_property
    def decoded_file_fields(self) -> list[pa.Field]:
        """Metadata stored in decoded-lane files: locator + decode error.

        The rest of ``all`` is joined from the raw file of the same name on read (the two
        files hold the same rows in the same order).
        """
        return [*self.locator_fields, pa.field(self.decode_error, DECODE_ERROR[1])]
