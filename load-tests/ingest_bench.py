"""Ingest benchmark: Thalweg's raw lane against a bare aiokafka consume loop.

Produces N JSON records (~200 B) to a fresh topic on a local tansu broker, then measures
in the same run:

  (a) baseline: a bare aiokafka ``getmany`` loop that only counts records;
  (b) thalweg:  ``twg stream`` (a subprocess, as deployed) until the raw lane holds all
      N records and the group has committed them.

Prints records/s and MB/s of both and the ratio (b)/(a). Not a test: machines here are
noisy, so only the ratio within one run means much.

    python load-tests/ingest_bench.py --records 1000000 --partitions 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from thalweg.embedded import TansuBroker


def make_value(i: int) -> bytes:
    doc = {
        "order_id": i,
        "customer": f"customer-{i % 9973:05d}",
        "item": "lantern",
        "quantity": i % 7 + 1,
        "amount": round((i % 1000) * 1.37, 2),
        "created_at": "2026-11-30T12:00:00Z",
        "note": "x" * 60,
    }
    return json.dumps(doc).encode()


def produce(bootstrap: str, topic: str, n: int, partitions: int) -> int:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 2_000_000,
            "log_level": 2,
        }
    )
    total = 0
    for i in range(n):
        v = make_value(i)
        total += len(v)
        while True:
            try:
                p.produce(topic, v, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10000 == 0:
            p.poll(0)
    p.flush(120)
    return total


async def bare_aiokafka(bootstrap: str, topic: str, n: int) -> float:
    c = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bare-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=50 << 20,
    )
    await c.start()
    start = time.perf_counter()
    seen = 0
    while seen < n:
        batches = await c.getmany(timeout_ms=200, max_records=10_000)
        seen += sum(len(v) for v in batches.values())
    elapsed = time.perf_counter() - start
    await c.stop()
    return elapsed


def thalweg(bootstrap: str, topic: str, n: int, partitions: int, fmt: str) -> tuple[float, float]:
    group = f"twg-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "twg.toml"
        cfg.write_text(f"""
[gateway]
data_dir = "{d}/lane"
flight_listen = "grpc://127.0.0.1:0"
http_listen = "127.0.0.1:0"
[[sources]]
name = "bench"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "{group}"
format = "{fmt}"
session_timeout_ms = 6000
heartbeat_interval_ms = 1000
""")
        watcher = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 2})
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        start = time.perf_counter()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "thalweg.cli.main",
                "--log-level",
                "warning",
                "stream",
                "--config",
                str(cfg),
            ],
            stdout=subprocess.DEVNULL,
        )
        first_commit = None
        try:
            while True:
                done = sum(max(tp.offset, 0) for tp in watcher.committed(tps, timeout=10))
                now = time.perf_counter()
                if done and first_commit is None:
                    first_commit = (now, done)
                if done >= n:
                    break
                if proc.poll() is not None:
                    raise SystemExit(f"twg stream exited with {proc.returncode}")
                time.sleep(0.1)
            end = time.perf_counter()
        finally:
            proc.terminate()
            proc.wait(30)
            watcher.close()
    assert first_commit is not None
    steady = (n - first_commit[1]) / max(end - first_commit[0], 1e-9)
    return end - start, steady


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument(
        "--format",
        choices=["json", "none"],
        default="json",
        help="decoded lane format (none: raw lane only)",
    )
    args = ap.parse_args()
    n, parts = args.records, args.partitions
    with TansuBroker() as broker:
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 2})
        admin.create_topics([NewTopic(topic, parts, 1)])[topic].result(10)
        t = time.perf_counter()
        value_bytes = produce(broker.bootstrap, topic, n, parts)
        took = time.perf_counter() - t
        print(f"produced {n:,} records ({value_bytes / n:.0f} B avg) in {took:.1f}s")
        bare = asyncio.run(bare_aiokafka(broker.bootstrap, topic, n))
        total, steady = thalweg(broker.bootstrap, topic, n, parts, args.format)
    mb = value_bytes / 1e6
    py = platform.python_version()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {py}")
    a_rate, b_rate = n / bare, n / total
    print(f"(a) bare aiokafka getmany count : {a_rate:10,.0f} rec/s  {mb / bare:7.1f} MB/s")
    print(
        f"(b) twg stream format={args.format:4} + commit: {b_rate:10,.0f} rec/s  "
        f"{mb / total:7.1f} MB/s  ({total:.2f}s incl. start-up)"
    )
    print(f"    twg stream steady state       : {steady:10,.0f} rec/s")
    print(
        f"ratio (b)/(a): {bare / total:.2f} (whole run), {steady / (n / bare):.2f} (steady state)"
    )


if __name__ == "__main__":
    main()
