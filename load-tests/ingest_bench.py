"""Ingest benchmark: Thalweg's raw lane against a bare aiokafka consume loop.

Produces N JSON records (~200 B) to a fresh topic on a local tansu broker, then measures
in the same run:

  (a) baseline: a bare aiokafka ``getmany`` loop that only counts records;
  (b) thalweg:  ``twg stream`` (a subprocess, as deployed) until the raw lane holds all
      N records and the group has committed them;
  (c) with ``--naive`` (JSON only): the pipeline a user writes first — aiokafka
      ``getmany``, ``json.loads`` per value, ``pa.Table.from_pylist``, one Parquet file
      per fetch, a commit after each file.

Prints records/s and MB/s and the ratios (b)/(a) and (b)/(c), with the CPU each used
per record. Not a test: machines here are
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
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from thalweg.embedded import TansuBroker, free_port


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


async def bare_aiokafka(
    bootstrap: str, topic: str, n: int, broker_pid: int
) -> tuple[float, float, float]:
    """Seconds from the first record to the n-th, counting only; and the CPU seconds this
    loop and the broker used in that time."""
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
    start = None
    seen = 0
    while seen < n:
        batches = await c.getmany(timeout_ms=200, max_records=10_000)
        got = sum(len(v) for v in batches.values())
        if got and start is None:
            start = time.perf_counter()
            cpu0, broker0 = time.process_time(), cpu_s(broker_pid)
        seen += got
    elapsed = time.perf_counter() - (start or time.perf_counter())
    cpu, broker_cpu = time.process_time() - cpu0, cpu_s(broker_pid) - broker0
    await c.stop()
    return elapsed, cpu, broker_cpu


def metric_sums(admin: str, *names: str) -> list[float]:
    """Metrics summed over their label sets, from one scrape of the gateway's /metrics
    (0 until it answers)."""
    try:
        with urllib.request.urlopen(admin + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return [0.0] * len(names)
    lines = text.splitlines()
    return [
        sum(float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith((name + "{", name + " ")))
        for name in names
    ]


#: How often the gateway's /metrics is read. Rendering it costs the gateway CPU (a few
#: ms each under load): polling twice every 20 ms, as this bench first did, took a
#: fifth of the gateway's GIL time (py-spy --gil) and pulled every ratio down.
POLL_S = 0.1


@dataclass
class Run:
    consume_s: float  # first record consumed -> last record consumed
    commit_s: float  # first record consumed -> last record durable and committed
    total_s: float  # process start -> last record committed (start-up and group join)
    cpu_s: float  # CPU seconds the gateway used from its first record to the last committed
    broker_cpu_s: float  # CPU seconds the broker used in the same window
    base_rss: int  # the gateway's RSS (bytes) when its first record was consumed
    peak_rss: int  # its highest RSS seen until the last record was committed
    peak_arrow: int  # the most Arrow's memory pool held meanwhile (twg_arrow_allocated_bytes)
    segments: int = 0  # raw-lane files at the end


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def naive_pipeline(bootstrap: str, topic: str, n: int, out: Path) -> float:
    """Seconds from the first record to the n-th written to Parquet and committed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    c = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"naive-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=50 << 20,
    )
    await c.start()
    start = None
    seen = files = 0
    try:
        while seen < n:
            batches = await c.getmany(timeout_ms=200, max_records=10_000)
            rows = [json.loads(r.value) for recs in batches.values() for r in recs]
            if not rows:
                continue
            if start is None:
                start = time.perf_counter()
            pq.write_table(pa.Table.from_pylist(rows), out / f"part-{files:06d}.parquet")
            files += 1
            await c.commit()
            seen += len(rows)
        return time.perf_counter() - (start or time.perf_counter())
    finally:
        await c.stop()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_stream(
    source: str,
    n: int,
    roll_age: float,
    consumed: str,
    done: str,
    broker_pid: int | None = None,
    raw_lane: str = "",
    gateway: str = "",
) -> Run:
    """Run ``twg stream`` (a subprocess, as deployed) over one ``[[sources]]`` table until
    the ``done`` metric reaches ``n``; times read from its own /metrics."""
    port = free_port()
    admin = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "twg.toml"
        cfg.write_text(f"""
[gateway]
data_dir = "{d}/lane"
flight_listen = "grpc://127.0.0.1:0"
http_listen = "127.0.0.1:{port}"
{gateway}
[raw_lane]
roll_age_s = {roll_age}
{raw_lane}
[[sources]]
{source}
""")
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "thalweg.cli.main", "--log-level", "warning", "stream"]
        proc = subprocess.Popen([*cmd, "--config", str(cfg)], stdout=subprocess.DEVNULL)
        first = all_consumed = None
        cpu0 = broker0 = 0.0
        base_rss = peak_rss = peak_arrow = 0
        try:
            while True:
                got, finished, arrow = metric_sums(
                    admin, consumed, done, "twg_arrow_allocated_bytes"
                )
                now = time.perf_counter()
                if got and first is None:
                    first = now
                    cpu0 = cpu_s(proc.pid)
                    broker0 = cpu_s(broker_pid) if broker_pid else 0.0
                    base_rss = rss_bytes(proc.pid)
                if first is not None:
                    peak_rss = max(peak_rss, rss_bytes(proc.pid))
                    peak_arrow = max(peak_arrow, int(arrow))
                if got >= n and all_consumed is None:
                    all_consumed = now
                if finished >= n:
                    cpu = cpu_s(proc.pid) - cpu0
                    broker_cpu = cpu_s(broker_pid) - broker0 if broker_pid else 0.0
                    break
                if proc.poll() is not None:
                    raise SystemExit(f"twg stream exited with {proc.returncode}")
                time.sleep(POLL_S)
        finally:
            proc.terminate()
            proc.wait(30)
        segments = sum(1 for _ in Path(d, "lane", "raw").rglob("*.parquet"))
    assert first is not None
    assert all_consumed is not None
    return Run(
        all_consumed - first,
        now - first,
        now - start,
        cpu,
        broker_cpu,
        base_rss,
        peak_rss,
        peak_arrow,
        segments,
    )


def thalweg(
    bootstrap: str,
    topic: str,
    n: int,
    fmt: str,
    roll_age: float,
    broker_pid: int,
    max_buffered_mb: int | None = None,
    segment_cache_mb: int | None = None,
    fetch_mb: int | None = None,
    ipc_copy_mb: int | None = None,
    roll_rows: int | None = None,
) -> Run:
    fetch = (
        f"\nfetch_max_bytes = {fetch_mb << 20}\nmax_partition_fetch_bytes = {fetch_mb << 20}"
        if fetch_mb
        else ""
    )
    source = f"""name = "bench"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "twg-{uuid.uuid4().hex[:6]}"
format = "{fmt}"
session_timeout_ms = 6000
heartbeat_interval_ms = 1000{fetch}"""
    flight = []
    if segment_cache_mb is not None:
        flight.append(f"segment_cache_bytes = {segment_cache_mb << 20}")
    if ipc_copy_mb is not None:
        flight.append(f"ipc_copy_bytes = {ipc_copy_mb << 20}")
    gateway = "[gateway.flight]\n" + "\n".join(flight) if flight else ""
    # Kafka positions are offsets: their sum over partitions reaches n at the end.
    return time_stream(
        source,
        n,
        roll_age,
        "twg_partition_consumed_position",
        "twg_partition_committed_position",
        broker_pid,
        "\n".join(
            line
            for line, wanted in (
                (f"max_buffered_bytes = {(max_buffered_mb or 0) << 20}", max_buffered_mb),
                (f"roll_rows = {roll_rows}", roll_rows),
            )
            if wanted
        ),
        gateway,
    )


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
    ap.add_argument(
        "--roll-age",
        type=float,
        default=5.0,
        help="raw_lane.roll_age_s for the gateway (default: the product default)",
    )
    ap.add_argument(
        "--roll-rows",
        type=int,
        help="raw_lane.roll_rows (default: the product default, 500000); below a "
        "partition's share of --records, segments are closed by rows, and a fetch that "
        "crosses the limit is cut there",
    )
    ap.add_argument(
        "--naive", action="store_true", help="also run (c), the naive user pipeline (JSON)"
    )
    ap.add_argument(
        "--max-buffered-mb",
        type=int,
        help="raw_lane.max_buffered_bytes in MiB (default: the product default, 256)",
    )
    ap.add_argument(
        "--segment-cache-mb",
        type=int,
        help="gateway.flight.segment_cache_bytes in MiB (default: the product default, 256)",
    )
    ap.add_argument(
        "--fetch-mb",
        type=int,
        help="the source's fetch_max_bytes and max_partition_fetch_bytes in MiB "
        "(default: the product defaults, 50 and 8)",
    )
    ap.add_argument(
        "--ipc-copy-mb",
        type=int,
        help="gateway.flight.ipc_copy_bytes in MiB (default: the product default, 1024; "
        "0: no IPC copies of decoded segments)",
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
        broker_pid = broker.pid
        bare, bare_cpu, bare_broker = asyncio.run(
            bare_aiokafka(broker.bootstrap, topic, n, broker_pid)
        )
        run = thalweg(
            broker.bootstrap,
            topic,
            n,
            args.format,
            args.roll_age,
            broker_pid,
            args.max_buffered_mb,
            args.segment_cache_mb,
            args.fetch_mb,
            args.ipc_copy_mb,
            args.roll_rows,
        )
        naive = None
        if args.naive:
            with tempfile.TemporaryDirectory() as d:
                naive = asyncio.run(naive_pipeline(broker.bootstrap, topic, n, Path(d)))
    mb = value_bytes / 1e6
    py = platform.python_version()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {py}")
    print(
        f"settings: {n:,} records, {parts} partitions, format={args.format}, "
        f"roll_age_s={args.roll_age}, roll_rows={args.roll_rows or 'default'}, "
        "default raw-lane settings otherwise (zstd-1)"
    )
    rows = [
        ("(a) bare aiokafka getmany, count only", bare),
        ("(b) twg stream: consumed into Arrow", run.consume_s),
        ("(b) twg stream: durable + committed", run.commit_s),
    ]
    if naive is not None:
        rows.append(("(c) naive pipeline: Parquet + committed", naive))
    for label, secs in rows:
        print(f"{label:40} {n / secs:10,.0f} rec/s {mb / secs:7.1f} MB/s ({secs:.2f}s)")
    print(f"start-up and group join of twg stream: {run.total_s - run.commit_s:.2f}s")
    print(f"raw-lane segments: {run.segments} ({n / max(run.segments, 1):,.0f} records each)")
    print(
        f"CPU per record: (a) {bare_cpu / n * 1e6:.2f} us + broker {bare_broker / n * 1e6:.2f} us;"
        f"  (b) gateway {run.cpu_s / n * 1e6:.2f} us + broker {run.broker_cpu_s / n * 1e6:.2f} us"
    )
    print(
        f"ratio consumed/(a): {bare / run.consume_s:.2f}   "
        f"ratio durable+committed/(a): {bare / run.commit_s:.2f}"
    )
    if naive is not None:
        print(f"ratio durable+committed/(c) naive: {naive / run.commit_s:.2f}")
    bound = (args.max_buffered_mb or 256) << 20
    grew = run.peak_rss - run.base_rss
    print(
        f"gateway RSS: {run.base_rss >> 20} MiB at the first record, peak {run.peak_rss >> 20} "
        f"MiB (+{grew >> 20} MiB = {grew / bound:.2f}x max_buffered_bytes {bound >> 20} MiB); "
        f"Arrow's pool peaked at {run.peak_arrow >> 20} MiB"
    )


if __name__ == "__main__":
    main()
