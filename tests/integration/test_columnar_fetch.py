"""A consumer fetching columns sees exactly the records a plain aiokafka consumer sees:
every codec, headers, null keys and values, and a record budget that leaves the rest for
the next fetch without skipping or repeating a record."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.consumer import fetcher
from confluent_kafka import Producer

from tests.helpers import kafka_column_fields, kafka_record_fields
from thalweg.embedded import TansuBroker
from thalweg.kafka.columnar_fetch import ColumnarFetch, _ColumnarPartitionRecords
from thalweg.kafka.unpack import KafkaColumns

pytestmark = pytest.mark.integration


def _produce(bootstrap: str, topic: str, codec: str, n: int) -> None:
    p = Producer(
        {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5, "log_level": 2}
    )
    for i in range(n):
        p.produce(
            topic,
            value=None if i % 97 == 5 else b"value-%d-" % i + b"x" * (i % 300),
            key=None if i % 3 else b"k%d" % (i % 11),
            headers=[("h", b"%d" % i), ("h", None)] if i % 5 == 0 else None,
            partition=0,
            timestamp=1_700_000_000_000 + i,
        )
    assert p.flush(30) == 0


async def _plain(bootstrap: str, topic: str, n: int) -> list[tuple[Any, ...]]:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await c.start()
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    await c.seek_to_beginning(tp)
    out: list[tuple[Any, ...]] = []
    try:
        while len(out) < n:
            for recs in (await c.getmany(timeout_ms=1000)).values():
                out += [kafka_record_fields(r) for r in recs]
    finally:
        await c.stop()
    return out


async def _columnar(
    bootstrap: str, topic: str, n: int, budget: int
) -> tuple[list[tuple[Any, ...]], int]:
    marker = ColumnarFetch()
    c = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, value_deserializer=marker
    )
    await c.start()
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    await c.seek_to_beginning(tp)
    out: list[tuple[Any, ...]] = []
    fetches = 0
    try:
        while len(out) < n:
            got: list[KafkaColumns] = []
            marker.remaining, wait = budget, 1000
            while marker.remaining > 0:  # as KafkaSource.fetch does: a batch a call
                more = (await c.getmany(timeout_ms=wait, max_records=1)).get(tp, [])
                if not more:
                    break
                got += more
                wait = 0
            if not got:
                continue
            cols = KafkaColumns.concat(got)
            assert len(cols) <= budget
            fetches += 1
            out += kafka_column_fields(cols)
            assert await c.position(tp) == out[-1][0] + 1  # the position follows the rows
    finally:
        await c.stop()
    return out, fetches


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_columns_equal_a_plain_consumer_s_records(
    broker: TansuBroker, topic_factory: Callable[..., str], codec: str
) -> None:
    topic = topic_factory(1, prefix=f"columnar-{codec}")
    n = 3000
    _produce(broker.bootstrap, topic, codec, n)
    expected = asyncio.run(_plain(broker.bootstrap, topic, n))
    got, _ = asyncio.run(_columnar(broker.bootstrap, topic, n, budget=1_000_000))
    assert len(expected) == n
    assert got == expected


def test_a_record_budget_splits_batches_without_losing_or_repeating_a_record(
    broker: TansuBroker, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(1, prefix="columnar-budget")
    n = 2000
    _produce(broker.bootstrap, topic, "none", n)
    got, fetches = asyncio.run(_columnar(broker.bootstrap, topic, n, budget=137))
    assert [r[0] for r in got] == list(range(n))  # every offset once, in order
    assert fetches >= n // 137


def test_the_fetcher_still_has_the_shape_this_path_relies_on() -> None:
    """aiokafka's fetcher builds ``PartitionRecords`` and ``MemoryRecords`` by these
    module names; if an upgrade moves them, this fails before ingest silently falls back
    to (or breaks) the per-record path."""
    assert fetcher.PartitionRecords is _ColumnarPartitionRecords
    assert fetcher.MemoryRecords.__name__ == "_KeptMemoryRecords"
    assert "_unpack_records" in vars(fetcher.PartitionRecords.__mro__[1])
