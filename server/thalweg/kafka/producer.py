"""The produce direction: records back into Kafka with nothing lost.

Accepts all three representations — :class:`RawRecord`, a raw-lane ``RecordBatch`` and
Value dicts — and preserves key, value, headers (order, duplicate keys, null values) and
the timestamp. The offset a record gets is the broker's to assign; the writer returns
it. Records are encoded by :mod:`thalweg.kafka.wire`, which writes a null key and a null
value as Kafka does (aiokafka's own ``send`` refuses a record with both null).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from thalweg.errors import ProduceError
from thalweg.kafka import wire
from thalweg.records.columns import MetadataColumns
from thalweg.records.convert import records_from_batch
from thalweg.records.model import Locator, RawRecord, Timestamp
from thalweg.records.rows import ProduceRows


@dataclass(frozen=True, slots=True)
class Written:
    """Where one record landed."""

    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Placed:
    """Where every record of one call landed, in input order."""

    partitions: np.ndarray
    offsets: np.ndarray

    def written(self) -> list[Written]:
        return [
            Written(p, o)
            for p, o in zip(self.partitions.tolist(), self.offsets.tolist(), strict=True)
        ]

    def ranges(self) -> dict[str, list[int]]:
        """``{"<partition>": [first offset, last offset]}``."""
        out: dict[str, list[int]] = {}
        for p in np.unique(self.partitions).tolist():
            at = self.offsets[self.partitions == p]
            out[str(p)] = [int(at.min()), int(at.max())]
        return out


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
        compression: the record batches' codec ("none", "gzip", "snappy", "lz4" or
            "zstd"), for batches built here and by aiokafka alike.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        columns: MetadataColumns | None = None,
        *,
        keep_partition: bool = True,
        idempotent: bool = False,
        compression: str = "none",
        **producer: Any,
    ) -> None:
        self.columns = columns or MetadataColumns()
        self.keep_partition = keep_partition
        producer.setdefault("max_batch_size", 1 << 20)  # 1 MiB batches: fewer requests
        self._batch_size = int(producer["max_batch_size"])
        self._compression = compression
        if compression != "none":
            producer["compression_type"] = compression
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_servers,
            acks="all",
            enable_idempotence=idempotent,
            **producer,
        )

    async def start(self) -> None:
        """Connect; on failure the producer is closed again and ProduceError raised."""
        try:
            await self._producer.start()
        except (KafkaError, KeyError, ValueError) as exc:
            await self._producer.stop()
            if isinstance(exc, KeyError | ValueError):
                # aiokafka's SCRAM client on a refused login (see thalweg.kafka.login).
                why = (
                    "authentication failed: the broker ended the SCRAM exchange without "
                    f"accepting it ({type(exc).__name__}: {exc})"
                )
            else:
                why = str(exc)
            raise ProduceError(f"cannot connect a producer: {why}") from exc

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> KafkaWriter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def send_records(self, topic: str, records: Sequence[RawRecord]) -> list[Written]:
        """Produce ``records`` and wait for every acknowledgement; returns where each landed,
        in input order (see :meth:`enqueue`)."""
        return await self.send_rows(topic, ProduceRows.of(list(records)))

    async def send_rows(self, topic: str, rows: ProduceRows) -> list[Written]:
        """Produce ``rows`` and wait for every acknowledgement; where each landed, in input
        order."""
        return (await (await self.enqueue(topic, rows))).written()

    async def enqueue(self, topic: str, rows: ProduceRows) -> Coroutine[Any, Any, Placed]:
        """Hand every row to the producer, in order, and return an awaitable of where they
        landed — so a caller can encode and enqueue its next rows while these are being
        acknowledged, and records of one partition still reach it in call order.

        Records are encoded into record batches in bulk (:mod:`thalweg.kafka.wire`, at
        most ``max_batch_size`` bytes each) and handed to aiokafka's ``send_batch``: one
        future per batch, none per record. The partition is the row's own
        (``keep_partition``), else the Kafka default partitioner's: murmur2 of the key
        (computed once per distinct key), and for rows without a key contiguous runs over
        all partitions (what a sticky partitioner does) instead of a random draw per row.
        Within a partition the input order is kept, and a record's offset is its batch's
        base offset plus its place in the batch.
        """
        try:
            partitions = sorted(await self._producer.partitions_for(topic))
        except KafkaError as exc:
            raise ProduceError(f"produce to {topic!r} failed: {exc}") from exc
        target = self._targets(rows, partitions)
        pending: list[tuple[int, np.ndarray, asyncio.Future[Any]]] = []
        try:
            async for p, members, batch in self._compressed(self._round_robin(rows, target)):
                fut = await self._producer.send_batch(batch, topic, partition=p)
                pending.append((p, members, fut))
        except KafkaError as exc:
            raise ProduceError(f"produce to {topic!r} failed: {exc}") from exc
        return self._placed(topic, len(rows), pending)

    async def _compressed(
        self, steps: Iterator[tuple[int, np.ndarray, wire.PrebuiltBatch]]
    ) -> AsyncIterator[tuple[int, np.ndarray, wire.PrebuiltBatch]]:
        """``steps`` in order, each batch compressed on a worker thread while the loop
        encodes the next one (the codecs release the GIL): compression no longer holds
        the event loop (gzip: 12 ms per MiB)."""
        if self._compression == "none":
            for step in steps:
                yield step
            return
        loop = asyncio.get_running_loop()
        ahead: tuple[tuple[int, np.ndarray, wire.PrebuiltBatch], asyncio.Future[None]] | None
        ahead = None
        for step in steps:
            packing = loop.run_in_executor(None, step[2].compress)
            if ahead is not None:
                await ahead[1]
                yield ahead[0]
            ahead = (step, packing)
        if ahead is not None:
            await ahead[1]
            yield ahead[0]

    def _targets(self, rows: ProduceRows, partitions: list[int]) -> np.ndarray:
        """The partition of every row."""
        n = len(rows)
        target = rows.partitions.copy() if self.keep_partition else np.full(n, -1, np.int64)
        free = target < 0
        if not free.any():
            return target
        keyed = free & rows.keys.is_valid().to_numpy(zero_copy_only=False)
        if keyed.any():
            at = np.flatnonzero(keyed)
            keys = pc.take(rows.keys, at).dictionary_encode()
            count = len(partitions)
            chosen = np.array(
                [
                    partitions[(murmur2(k) & 0x7FFFFFFF) % count]
                    for k in keys.dictionary.to_pylist()
                ],
                np.int64,
            )
            target[at] = chosen[keys.indices.to_numpy(zero_copy_only=False)]
        keyless = np.flatnonzero(free & ~keyed)
        if len(keyless):
            k, count = len(keyless), len(partitions)
            runs = (random.randrange(count) + np.arange(k) * count // k) % count
            target[keyless] = np.asarray(partitions, np.int64)[runs]
        return target

    def _round_robin(
        self, rows: ProduceRows, target: np.ndarray
    ) -> Iterator[tuple[int, np.ndarray, wire.PrebuiltBatch]]:
        """Every partition's record batches, one partition after the other in turn, so
        each partition has a batch ready while the last one is in flight."""
        order = np.argsort(target, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(target[order])) + 1)
        queues = [
            (int(target[g[0]]), g, wire.batches(rows.take(g), self._batch_size, self._compression))
            for g in groups
            if len(g)
        ]
        while queues:
            left = []
            for p, members, chunks in queues:
                step = next(chunks, None)
                if step is not None:
                    start, stop, batch = step
                    yield p, members[start:stop], batch
                    left.append((p, members, chunks))
            queues = left

    async def _placed(
        self, topic: str, n: int, pending: list[tuple[int, np.ndarray, asyncio.Future[Any]]]
    ) -> Placed:
        partitions = np.empty(n, np.int64)
        offsets = np.empty(n, np.int64)
        try:
            for p, members, fut in pending:
                meta = await fut
                partitions[members] = p
                offsets[members] = meta.offset + np.arange(len(members))
        except KafkaError as exc:
            raise ProduceError(f"produce to {topic!r} failed: {exc}") from exc
        return Placed(partitions, offsets)

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
