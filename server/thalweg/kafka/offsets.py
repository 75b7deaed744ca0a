"""A Kafka cluster's positions, read without joining any group (``twg verify``).

The log start and end of each partition come from a consumer with no group id (it never
joins, so it cannot trigger a rebalance of the gateways' group); the group's committed
offsets from the admin API. Both speak the source's security settings.

The end is the high watermark a fetch response reports, as the gateway reads it
(``sources.kafka``): tansu answers a ListOffsets(latest) wrongly (the last batch's base
offset + 1, or less), so ``end_offsets`` is only the fallback when no fetch answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from thalweg.config.models import KafkaSourceConfig
from thalweg.errors import SourceError
from thalweg.kafka.clients import security_kwargs


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """One partition as the cluster sees it; None where it does not say."""

    log_start: int | None
    log_end: int | None
    committed: int | None


async def cluster_offsets(cfg: KafkaSourceConfig, topic: str) -> dict[int, PartitionOffsets]:
    """Every partition of ``topic``: log start and end, and the source group's commit.

    Raises:
        SourceError: the cluster did not answer.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=cfg.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        request_timeout_ms=cfg.request_timeout_ms,
        max_partition_fetch_bytes=1,  # a fetch is for its high watermark, not its records
        fetch_max_wait_ms=100,
        **security_kwargs(cfg),
    )
    admin = AIOKafkaAdminClient(
        bootstrap_servers=cfg.bootstrap_servers,
        request_timeout_ms=cfg.request_timeout_ms,
        **security_kwargs(cfg),
    )
    try:
        await consumer.start()
        await admin.start()
        partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            await consumer.topics()  # a metadata request names the topic's partitions
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        starts = await consumer.beginning_offsets(tps) if tps else {}
        ends = await _high_watermarks(consumer, tps, starts)
        committed = await admin.list_consumer_group_offsets(cfg.group_id, partitions=tps)
    except KafkaError as exc:
        raise SourceError(f"{cfg.bootstrap_servers}: offsets of {topic!r}: {exc}") from exc
    finally:
        await consumer.stop()
        await admin.close()
    out = {}
    for tp in tps:
        meta = committed.get(tp)
        offset = meta.offset if meta is not None and meta.offset >= 0 else None
        out[tp.partition] = PartitionOffsets(starts.get(tp), ends.get(tp), offset)
    return out


async def _high_watermarks(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition], starts: dict[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """Each partition's end as a fetch response reports it (a few fetches at most)."""
    if not tps:
        return {}
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, starts.get(tp, 0))
    for _ in range(20):
        if all(consumer.highwater(tp) is not None for tp in tps):
            break
        await consumer.getmany(timeout_ms=200, max_records=1)
    found = {tp: consumer.highwater(tp) for tp in tps}
    missing = [tp for tp, hw in found.items() if hw is None]
    fallback = await consumer.end_offsets(missing) if missing else {}
    return {tp: int(hw) if hw is not None else int(fallback[tp]) for tp, hw in found.items()}
