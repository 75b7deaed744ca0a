"""Dead letters to a Kafka topic, besides the Parquet ``dlq/`` lane.

Each dead-lettered record is produced with its original key, value and headers, plus
headers under our own prefix in the style of Kafka Connect's ``__connect.errors.*``:
``__twg.errors.reason``, ``.stage``, ``.message``, ``.topic``, ``.partition``,
``.offset``, ``.timestamp`` (ms) and ``.ts`` (when it was dead-lettered, µs).

The Parquet lane stays the durable record: it is written before the raw segment, so
before any commit. The topic is produced (acks=all) after the segment and before the
commit, and retried until it succeeds — a crash between the two leaves a letter in the
Parquet lane only (the restart resumes after the segment).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any

import pyarrow as pa

from thalweg.kafka.producer import KafkaWriter
from thalweg.records.columns import MetadataColumns
from thalweg.records.convert import records_from_batch
from thalweg.records.model import RawRecord

PREFIX = b"__twg.errors."


def dead_letter_records(dead: pa.Table, columns: MetadataColumns) -> list[RawRecord]:
    """The records to produce for a dead-letter table (raw columns + ``dlq_*``)."""
    raw = dead.select(columns.raw_schema.names)
    records = records_from_batch(raw, columns)
    extra = {
        "reason": dead.column(columns.stamped("dlq_reason")).to_pylist(),
        "stage": dead.column(columns.stamped("dlq_stage")).to_pylist(),
        "message": dead.column(columns.stamped("dlq_error")).to_pylist(),
        "ts": dead.column(columns.stamped("dlq_ts")).cast(pa.int64()).to_pylist(),
    }
    out = []
    for i, r in enumerate(records):
        loc = r.locator
        headers = [
            (PREFIX + b"reason", _b(extra["reason"][i])),
            (PREFIX + b"stage", _b(extra["stage"][i])),
            (PREFIX + b"message", _b(extra["message"][i])),
            (PREFIX + b"topic", _b(loc.topic)),
            (PREFIX + b"partition", _b(loc.partition)),
            (PREFIX + b"offset", _b(loc.offset)),
            (PREFIX + b"timestamp", _b(r.timestamp.ms)),
            (PREFIX + b"ts", _b(extra["ts"][i])),
        ]
        # Produced by the partitioner into the DLQ topic: its partitions are its own.
        locator = dataclasses.replace(loc, partition=-1)
        out.append(dataclasses.replace(r, headers=(*r.headers, *headers), locator=locator))
    return out


def _b(value: object) -> bytes | None:
    return None if value is None else str(value).encode()


class DeadLetterTopic:
    """A started producer for one source's DLQ topic."""

    def __init__(
        self, bootstrap_servers: str, topic: str, columns: MetadataColumns, **client: Any
    ) -> None:
        """``client``: further aiokafka producer arguments — the source cluster's security
        settings (``thalweg.kafka.clients``)."""
        self.topic = topic
        self._bootstrap = bootstrap_servers
        self._columns = columns
        self._client = client
        self._writer: KafkaWriter | None = None  # made on the event loop, at first use

    def make_writer(self) -> KafkaWriter:
        """A new (not started) producer for the topic; call on the event loop."""
        return KafkaWriter(self._bootstrap, self._columns, keep_partition=False, **self._client)

    async def send(self, dead: pa.Table) -> int:
        """Produce every dead letter and wait for all acknowledgements; the count."""
        if self._writer is None:
            writer = self.make_writer()
            try:
                await writer.start()
            except asyncio.CancelledError:  # a bounded wait ran out mid-connect
                with contextlib.suppress(Exception):
                    await writer.stop()
                raise
            self._writer = writer
        placed = await self._writer.send_records(
            self.topic, dead_letter_records(dead, self._columns)
        )
        return len(placed)

    async def stop(self) -> None:
        if self._writer is not None:
            await self._writer.stop()
            self._writer = None
