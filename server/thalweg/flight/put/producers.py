"""The produce side of ``do_put``, one shape for both transports.

Each put batch becomes one acknowledgement, written as PutResult metadata:
``{"rows": n, "partitions": {"<p>": [first, last]}}`` where first/last are lane
positions — Kafka offsets, or packed Pulsar message ids (``thalweg.records.position``),
so a reader can ask for exactly those rows back. Pulsar acknowledgements also list each
row's ``message_ids`` (hex of the serialized id, in row order).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from thalweg.config.models import PulsarSourceConfig
from thalweg.kafka.producer import KafkaWriter, Placed
from thalweg.pulsar.producer import PulsarWriter
from thalweg.records.position import pack_message_id
from thalweg.records.rows import ProduceRows

Ack = dict[str, Any]


class TopicProducer(Protocol):
    async def start(self) -> None: ...

    async def submit(self, topic: str, rows: ProduceRows) -> Awaitable[Ack]:
        """Hand ``rows`` over for producing, in order after every earlier submit, and
        return an awaitable of their acknowledgement."""
        ...

    async def stop(self) -> None: ...


async def _ready(ack: Ack) -> Ack:
    return ack


def _ranges(placed: Sequence[tuple[int, int]]) -> dict[str, list[int]]:
    ranges: dict[str, list[int]] = {}
    for partition, position in placed:
        r = ranges.setdefault(str(partition), [position, position])
        r[0], r[1] = min(r[0], position), max(r[1], position)
    return ranges


class KafkaTopicProducer:
    def __init__(self, writer: KafkaWriter) -> None:
        self._writer = writer

    async def start(self) -> None:
        await self._writer.start()

    async def stop(self) -> None:
        await self._writer.stop()

    async def submit(self, topic: str, rows: ProduceRows) -> Awaitable[Ack]:
        return self._ack(await self._writer.enqueue(topic, rows))

    @staticmethod
    async def _ack(placing: Awaitable[Placed]) -> Ack:
        placed = await placing
        return {"rows": len(placed.offsets), "partitions": placed.ranges()}


class PulsarTopicProducer:
    """Produces into ``tenant/namespace/topic`` of a Pulsar source."""

    def __init__(self, source: PulsarSourceConfig, send_timeout_ms: int) -> None:
        self._prefix = source.namespace_prefix
        self._cluster = source.cluster_name
        self._writer = PulsarWriter(
            source.service_url,
            send_timeout_millis=send_timeout_ms,
            batching_enabled=True,
            block_if_queue_full=True,
        )

    async def start(self) -> None:
        await self._writer.start()

    async def stop(self) -> None:
        await self._writer.stop()

    async def submit(self, topic: str, rows: ProduceRows) -> Awaitable[Ack]:
        """Sends and waits here: the Pulsar writer flushes each call."""
        return _ready(await self._send(topic, rows))

    async def _send(self, topic: str, rows: ProduceRows) -> Ack:
        records = rows.records(self._cluster, topic)
        placed = await self._writer.send_records(self._prefix + topic, records)
        return {
            "rows": len(placed),
            "partitions": _ranges(
                [
                    (max(w.partition, 0), pack_message_id(w.ledger_id, w.entry_id, w.batch_index))
                    for w in placed
                ]
            ),
            "message_ids": [w.message_id.hex() for w in placed],
        }
