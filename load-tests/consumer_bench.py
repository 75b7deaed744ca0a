"""Which Kafka client should feed the raw lane? Four consumers of one backlog, one run.

Issue 18 asked for a ``client = "confluent"`` source (librdkafka consumes about twice as
fast as aiokafka in bare loops), or figures showing why it does not pay. Over the same
``--records`` JSON records (~212 B) on a local tansu broker:

  (a) a bare aiokafka ``getmany`` loop that only counts;
  (b) a bare confluent-kafka ``consume(10000)`` loop that only counts (librdkafka tuned:
      ``queued.min.messages`` 1 M, 8 MiB partition fetches);
  (c) the same confluent loop making raw-lane batches of its messages, as a confluent
      source would (value, key, offset, timestamp, headers, partition read one call per
      field per message — the Python API has no batch-level accessor — then the same
      column builder Thalweg's source uses);
  (d) Thalweg's Kafka source: aiokafka's fetcher with record batches decoded into
      columns in bulk (``thalweg.kafka.unpack``), producing whole raw-lane batches,
      record ids included.

Prints records/s and the CPU this process used per record (librdkafka's threads
included). Not a test: only ratios within one run mean much on this machine.

    python load-tests/consumer_bench.py --records 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer

sys.path.insert(0, str(Path(__file__).parent))
from ingest_bench import bare_aiokafka, produce
from thalweg.config.models import KafkaSourceConfig
from thalweg.embedded import TansuBroker
from thalweg.records.columns import MetadataColumns
from thalweg.records.raw_batch import build_headers, raw_batch_from_columns
from thalweg.sources.kafka import KafkaSource

COLUMNS = MetadataColumns()


def raw_batches(topic: str, msgs: list[Any]) -> list[pa.RecordBatch]:
    """What a confluent-kafka source would make of one ``consume``: the fields read
    message by message (the only way the API offers), then one raw-lane batch per
    partition, as ``KafkaSource.fetch`` returns."""
    k = len(msgs)
    partitions = np.fromiter((m.partition() for m in msgs), np.int32, count=k)
    offsets = np.fromiter((m.offset() for m in msgs), np.int64, count=k)
    stamps = [m.timestamp() for m in msgs]
    keys = pa.array([m.key() for m in msgs], pa.binary())
    values = pa.array([m.value() for m in msgs], pa.binary())
    headers = build_headers([m.headers() or () for m in msgs])
    types = np.array([t for t, _ in stamps], np.int8) - 1  # librdkafka: 1 create, 2 log append
    ms = np.array([v for _, v in stamps], np.int64)
    out = []
    for p in np.unique(partitions).tolist():
        at = np.flatnonzero(partitions == p)
        out.append(
            raw_batch_from_columns(
                topic=topic,
                partition=p,
                offsets=offsets[at],
                timestamps_ms=ms[at],
                timestamp_types=types[at],
                keys=keys.take(at),
                values=values.take(at),
                headers=headers.take(at),
                cluster="",
                ingest_ts_us=time.time_ns() // 1000,
                columns=COLUMNS,
            )
        )
    return out


def confluent(bootstrap: str, topic: str, n: int, build: bool) -> tuple[float, float]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"c-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "queued.min.messages": 1_000_000,
            "max.partition.fetch.bytes": 8 << 20,
            "fetch.max.bytes": 50 << 20,
            "log_level": 2,
        }
    )
    c.subscribe([topic])
    seen, start, cpu0 = 0, 0.0, 0.0
    try:
        while seen < n:
            msgs = c.consume(10_000, 0.5)
            if not msgs:
                continue
            if not seen:
                start, cpu0 = time.perf_counter(), time.process_time()
            if build:
                pa.array([m.value() for m in msgs], pa.binary())
                pa.array([m.key() for m in msgs], pa.binary())
                np.fromiter((m.offset() for m in msgs), np.int64, count=len(msgs))
                np.array([m.timestamp()[1] for m in msgs], np.int64)
                [m.headers() for m in msgs]
                [m.partition() for m in msgs]
            seen += len(msgs)
        return time.perf_counter() - start, time.process_time() - cpu0
    finally:
        c.close()


async def thalweg_source(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    cfg = KafkaSourceConfig(
        name="bench",
        bootstrap_servers=bootstrap,
        topics=[topic],
        format="none",
        group_id=f"twg-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
    )
    source = KafkaSource(cfg, MetadataColumns())

    async def nothing(*_: object) -> None:
        return None

    await source.start(nothing, nothing)
    seen, start, cpu0 = 0, 0.0, 0.0
    try:
        while seen < n:
            out = await source.fetch(500, 100_000)
            if out and not seen:
                start, cpu0 = time.perf_counter(), time.process_time()
            seen += sum(b.num_rows for b in out.values())
        return time.perf_counter() - start, time.process_time() - cpu0
    finally:
        await source.stop()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args()
    n = args.records
    gc.set_threshold(100_000, 10, 10)  # as the gateway runs (ADR 0004), for every side
    with TansuBroker() as broker:
        topic = f"consumers-{uuid.uuid4().hex[:8]}"
        produce(broker.bootstrap, topic, n, args.partitions)
        runs = {
            "(a) aiokafka bare count": asyncio.run(
                bare_aiokafka(broker.bootstrap, topic, n, broker.pid)
            )[:2],
            "(b) confluent bare count": confluent(broker.bootstrap, topic, n, build=False),
            "(c) confluent + raw-lane columns": confluent(broker.bootstrap, topic, n, build=True),
            "(d) thalweg source (raw batches)": asyncio.run(
                thalweg_source(broker.bootstrap, topic, n)
            ),
        }
    for label, (secs, cpu) in runs.items():
        print(f"{label:34s} {n / secs:10,.0f} rec/s   CPU {cpu / n * 1e6:5.2f} us/rec")


if __name__ == "__main__":
    main()
