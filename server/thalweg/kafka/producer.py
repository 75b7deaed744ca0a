"""The produce direction: records back into Kafka with nothing lost.

Accepts all three representations — :class:`RawRecord`, a raw-lane ``RecordBatch`` and
Value dicts — and preserves key, value, headers (order, duplicate keys, null values) and
the timestamp. The offset a record gets is the broker's to assign; the writer returns
it. aiokafka cannot send a record whose key *and* value are both null; such a record is
refused with a clear error rather than silently altered.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

from thalweg.errors import ProduceError, ThalwegError
from thalweg.records.columns import MetadataColumns
from thalweg.records.convert import records_from_batch
from thalweg.records.model import Locator, RawRecord, Timestamp
from thalweg.records.rows import ProduceRows


@dataclass(frozen=True, slots=True)
class Written:
    """Where one record landed."""

    partition: int
    offset: int


def _json_payload(row: dict[str, Any], prefix: str) -> bytes:
    return json.dumps({k: v for k, v in row.items() if k != prefix}, default=str).encode()


class KafkaWriter:
    """Writes records to Kafka with aiokafka (acks=all).

    Args:
        bootstrap_servers: brokers to write to.
        columns: metadata names (to read raw-lane batches and Value dicts).
        keep_partition: write each record to the partition it was read from (default);
            otherwise the producer's partitioner decides.
        idempotent: use the idempotent producer (no duplicates on retry); the broker must
            support it (tansu does not: its InitProducerId answers are refused).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        columns: MetadataColumns | None = None,
        *,
        keep_partition: bool = True,
        idempotent: bool = False,
        **producer: Any,
    ) -> None:
        self.columns = columns or MetadataColumns()
        self.keep_partition = keep_partition
        producer.setdefault("max_batch_size", 1 << 20)  # 1 MiB batches: fewer requests
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_servers,
            acks="all",
            enable_idempotence=idempotent,
            **producer,
        )
        self._partitioner = DefaultPartitioner()

    async def start(self) -> None:
        """Connect; on failure the producer is closed again and ProduceError raised."""
        try:
            await self._producer.start()
        except KafkaError as exc:
            await self._producer.stop()
            raise ProduceError(f"cannot connect a producer: {exc}") from exc

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> KafkaWriter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def send_records(self, topic: str, records: Sequence[RawRecord]) -> list[Written]:
        """Produce ``records`` and wait for every acknowledgement; returns where each landed,
        in input order (see :meth:`send_rows`)."""
        for r in records:
            if r.key is None and r.value is None:
                raise ThalwegError(
                    "a record with a null key and a null value cannot be produced with "
                    f"aiokafka (offset {r.locator.offset} of {r.locator.topic})"
                )
        return await self.send_rows(topic, ProduceRows.of(list(records)))

    async def send_rows(self, topic: str, rows: ProduceRows) -> list[Written]:
        """Produce ``rows`` and wait for every acknowledgement; returns where each landed,
        in input order.

        Records are packed into producer batches per partition (``create_batch`` /
        ``send_batch``) instead of one ``send`` each: one future per batch, not per
        record, which is most of a per-record produce's Python cost. The partition is the
        row's own (``keep_partition``), else aiokafka's default partitioner (murmur2 of
        the key; random without one), as ``send`` would choose. Within a partition the
        input order is kept, and a record's offset is its batch's base offset plus its
        place in the batch.
        """
        n = len(rows)
        if not n:
            return []
        try:
            partitions = sorted(await self._producer.partitions_for(topic))
        except KafkaError as exc:
            raise ProduceError(f"produce to {topic!r} failed: {exc}") from exc
        keys, values, stamps = rows.keys, rows.values, rows.timestamps_ms
        groups: dict[int, list[int]] = {}
        keep = self.keep_partition
        for i in range(n):
            key, own = keys[i], rows.partitions[i]
            if key is None and values[i] is None:
                raise ThalwegError(
                    f"row {i}: a record with a null key and a null value cannot be produced "
                    "with aiokafka"
                )
            p = own if keep and own >= 0 else self._partitioner(key, partitions, partitions)
            groups.setdefault(p, []).append(i)
        pending: list[tuple[int, list[int], Any]] = []
        try:
            for p, members in groups.items():
                batch = self._producer.create_batch()
                held: list[int] = []
                for i in members:
                    headers = [(k.decode("utf-8"), v) for k, v in rows.headers[i]]
                    if (
                        batch.append(
                            timestamp=stamps[i], key=keys[i], value=values[i], headers=headers
                        )
                        is None
                    ):  # full: send it, start another
                        if not held:
                            raise ThalwegError(
                                f"a record of {len(values[i] or b'')} bytes does not fit one "
                                "producer batch (max_batch_size)"
                            )
                        fut = await self._producer.send_batch(batch, topic, partition=p)
                        pending.append((p, held, fut))
                        batch, held = self._producer.create_batch(), []
                        if (
                            batch.append(
                                timestamp=stamps[i], key=keys[i], value=values[i], headers=headers
                            )
                            is None
                        ):
                            raise ThalwegError("a record does not fit an empty producer batch")
                    held.append(i)
                if held:
                    fut = await self._producer.send_batch(batch, topic, partition=p)
                    pending.append((p, held, fut))
            out: list[Written | None] = [None] * n
            for p, held, fut in pending:
                meta = await fut
                for j, i in enumerate(held):
                    out[i] = Written(p, meta.offset + j)
        except KafkaError as exc:
            raise ProduceError(f"produce to {topic!r} failed: {exc}") from exc
        return [w for w in out if w is not None]

    async def send_batch(self, topic: str, batch: pa.RecordBatch | pa.Table) -> list[Written]:
        """Produce the rows of a raw-lane batch."""
        return await self.send_records(topic, records_from_batch(batch, self.columns))

    async def send_values(
        self,
        topic: str,
        rows: Sequence[dict[str, Any]],
        encode: Callable[[dict[str, Any]], bytes] | None = None,
    ) -> list[Written]:
        """Produce Value-lane dicts: the payload fields encoded (JSON by default), key,
        headers, timestamp and partition taken from the reserved metadata mapping when it
        carries them (``metadata = "all"``)."""
        prefix = self.columns.prefix
        enc = encode or (lambda row: _json_payload(row, prefix))
        records = []
        for row in rows:
            meta = row.get(prefix, {})
            records.append(_record_from_value(topic, enc(row), meta))
        return await self.send_records(topic, records)


def _record_from_value(topic: str, value: bytes, meta: dict[str, Any]) -> RawRecord:
    """A record for a Value row; what the metadata does not say is left to the producer
    (timestamp: now; partition: the partitioner, marked by -1)."""
    ts = meta.get("source_timestamp")  # epoch milliseconds in the Value lane
    ms = int(ts) if ts is not None else time.time_ns() // 1_000_000
    headers = tuple((h["key"], h["value"]) for h in meta.get("source_headers") or ())
    partition = meta.get("source_partition")
    return RawRecord(
        key=meta.get("source_key"),
        value=value,
        headers=headers,
        timestamp=Timestamp(ms),
        locator=Locator(
            meta.get("source_cluster") or "", topic, -1 if partition is None else partition
        ),
    )
