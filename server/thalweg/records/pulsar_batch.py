"""Turn received Pulsar messages of one partition into a raw-lane RecordBatch.

The Pulsar client hands over one Python object per message and one C++ call per field,
and those calls are most of a Pulsar source's cost (load-tests/pulsar_profile.py). So
each is made as few times as the data allows: a message's id is read as its bytes and
decoded in bulk (``records.pulsar_ids``); the fields of an entry's metadata — publish
time, producer name — once per run of the entry; the rest once per message with
``map``. Every column is then built with one bulk call, as for Kafka (``raw_batch``).

Field mapping (``docs/pulsar.md``): properties become ``headers`` in the order the
client returns them; ``timestamp`` is the event time when the producer set one, else the
publish time (both are producer clocks: ``CreateTime``); an unset event time (0) is
null. The Python client cannot tell an absent partition or ordering key from an empty
one, so both are null. Kafka-only columns are null.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import methodcaller
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.records.columns import (
    SOURCE_COLUMNS,
    TIMESTAMP_MS,
    TIMESTAMP_US,
    MetadataColumns,
)
from thalweg.records.position import pack_message_ids
from thalweg.records.pulsar_ids import MessageIdParts, parse_message_ids
from thalweg.records.raw_batch import assemble_headers, constant
from thalweg.records.record_id import record_ids


class PulsarLikeMessageId(Protocol):
    """The part of a message id we read (pulsar-client's ``MessageId`` fits): its
    bytes, whose fields are decoded in bulk (``records.pulsar_ids``)."""

    def serialize(self) -> bytes: ...


class PulsarLikeMessage(Protocol):
    """The fields of a received message we read (pulsar-client's ``Message`` fits)."""

    def message_id(self) -> PulsarLikeMessageId: ...
    def data(self) -> bytes: ...
    def has_null_value(self) -> bool: ...
    def partition_key(self) -> str: ...
    def ordering_key(self) -> str: ...
    def properties(self) -> Mapping[str, str]: ...
    def publish_timestamp(self) -> int: ...
    def event_timestamp(self) -> int: ...
    def producer_name(self) -> str: ...
    def redelivery_count(self) -> int: ...


_ids = methodcaller("message_id")
_serialize = methodcaller("serialize")


@dataclass(frozen=True, slots=True)
class ReceivedIds:
    """The message ids of received messages: the client's objects (acknowledgements take
    them), their bytes (the ``message_id`` column) and their fields, decoded in bulk."""

    ids: list[PulsarLikeMessageId]
    serialized: list[bytes]
    parts: MessageIdParts

    @classmethod
    def of(cls, messages: Sequence[PulsarLikeMessage]) -> ReceivedIds:
        """Raises ``ValueError`` when the client's bytes are not a message id."""
        ids = list(map(_ids, messages))
        serialized = list(map(_serialize, ids))
        return cls(ids, serialized, parse_message_ids(serialized))

    def take(self, rows: Sequence[int]) -> ReceivedIds:
        return ReceivedIds(
            [self.ids[i] for i in rows],
            [self.serialized[i] for i in rows],
            self.parts.take(np.asarray(rows, np.intp)),
        )

    @staticmethod
    def concat(chunks: Sequence[ReceivedIds]) -> ReceivedIds:
        if len(chunks) == 1:
            return chunks[0]
        return ReceivedIds(
            list(chain.from_iterable(c.ids for c in chunks)),
            list(chain.from_iterable(c.serialized for c in chunks)),
            MessageIdParts.concat([c.parts for c in chunks]),
        )


def entry_runs(
    ledger: npt.NDArray[np.int64], entry: npt.NDArray[np.int64], batch: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """The first message of each run of one entry, and each message's run number.

    A run is a stretch of messages of one entry with rising batch indexes. An entry
    handed over again starts a new run when its batch indexes start over, and every
    message that is not batched (batch index -1) is a run of its own. All messages of a
    run share the entry's metadata, whichever delivery each came from."""
    n = len(ledger)
    starts = np.ones(n, np.bool_)
    starts[1:] = (
        (ledger[1:] != ledger[:-1])
        | (entry[1:] != entry[:-1])
        | (batch[1:] <= batch[:-1])
        | (batch[1:] < 0)
    )
    return np.flatnonzero(starts), np.cumsum(starts) - 1


def _utf8_or_null(values: list[str]) -> pa.Array:
    """UTF-8 bytes of ``values``, with "" as null (one vectorised pass, no per-value
    encode: Arrow's string and binary share their bytes)."""
    arr = pa.array(values, pa.string())
    return pc.if_else(pc.equal(arr, ""), pa.scalar(None, pa.binary()), arr.cast(pa.binary()))


def _ms_or_null(values: npt.NDArray[np.int64]) -> pa.Array:
    return pa.array(values, mask=values == 0).view(TIMESTAMP_MS)


def _properties(props: list[Mapping[str, str]]) -> pa.Array:
    """``list<struct<key, value>>`` of each message's properties, in the client's order
    (Arrow's string and binary share their bytes: no per-value encode)."""

    def flat() -> tuple[pa.Array, pa.Array]:
        keys = pa.array(list(chain.from_iterable(props)), pa.string())
        vals = pa.array(list(chain.from_iterable(p.values() for p in props)), pa.string())
        return keys.cast(pa.binary()), vals.cast(pa.binary())

    return assemble_headers(props, flat)


def build_pulsar_raw_batch(
    messages: Sequence[PulsarLikeMessage],
    *,
    topic: str,
    partition: int,
    cluster: str,
    ingest_ts_us: int,
    columns: MetadataColumns,
    ids: ReceivedIds | None = None,
) -> pa.RecordBatch:
    """Build the raw-lane batch for messages of one (topic, partition), in id order.

    Args:
        topic: the lane's topic name (the short name, without tenant/namespace).
        partition: the partition index (0 for a non-partitioned topic).
        cluster: the source's cluster name (part of the record id).
        ingest_ts_us: when the batch was received, in µs since the epoch.
        ids: the messages' ids, when the caller has them already.

    Raises:
        PositionOverflowError: a message id does not fit the packed position.
        ValueError: the client's bytes of a message id are not a message id.
    """
    n = len(messages)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=columns.raw_schema)
    if ids is None:
        ids = ReceivedIds.of(messages)
    ledger, entry, batch = ids.parts.ledger, ids.parts.entry, ids.parts.batch
    positions = pack_message_ids(ledger, entry, batch)
    nulls = np.fromiter(map(methodcaller("has_null_value"), messages), np.bool_, n)
    data = list(map(methodcaller("data"), messages))
    # Publish time and producer name belong to an entry (the batch's metadata), not to
    # each message of the batch: they are read once per run of an entry and spread over
    # its messages. Not the redelivery count: after a reconnect the client can hand over
    # the rest of an entry from a second delivery right behind the first's messages.
    firsts, run_of = entry_runs(ledger, entry, batch)
    heads = [messages[i] for i in firsts.tolist()] if len(firsts) < n else messages
    publish = np.fromiter(map(methodcaller("publish_timestamp"), heads), np.int64)[run_of]
    producers = pa.array(list(map(methodcaller("producer_name"), heads)), pa.string())
    redeliveries = np.fromiter(map(methodcaller("redelivery_count"), messages), np.int32, n)
    event = np.fromiter(map(methodcaller("event_timestamp"), messages), np.int64, n)
    ts = np.where(event != 0, event, publish)
    built: dict[str, pa.Array] = {
        "cluster": constant(cluster, pa.string(), n),
        "topic": constant(topic, pa.string(), n),
        "partition": constant(partition, pa.int32(), n),
        "message_id": pa.array(ids.serialized, pa.binary()),
        "ledger_id": pa.array(ledger),
        "entry_id": pa.array(entry),
        "batch_index": pa.array(batch.astype(np.int32)),
        "key": _utf8_or_null(list(map(methodcaller("partition_key"), messages))),
        "ordering_key": _utf8_or_null(list(map(methodcaller("ordering_key"), messages))),
        "value": pa.array(data, pa.binary(), mask=nulls if nulls.any() else None),
        "headers": _properties(list(map(methodcaller("properties"), messages))),
        "timestamp": pa.array(ts).view(TIMESTAMP_MS),
        "timestamp_type": constant("CreateTime", pa.string(), n),
        "publish_time": _ms_or_null(publish),
        "event_time": _ms_or_null(event),
        "producer_name": producers if len(firsts) == n else producers.take(pa.array(run_of)),
        "redelivery_count": pa.array(redeliveries),
    }
    arrays = [
        built[suffix] if suffix in built else pa.nulls(n, type_) for suffix, type_ in SOURCE_COLUMNS
    ]
    arrays.append(record_ids(cluster, topic, partition, positions))
    arrays.append(pa.array(positions))
    arrays.append(constant(ingest_ts_us, TIMESTAMP_US, n))
    return pa.RecordBatch.from_arrays(arrays, schema=columns.raw_schema)
