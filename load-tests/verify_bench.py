"""What does ``twg verify --deep`` cost per million records? One backlog, one run.

Over ``--records`` JSON records (~212 B) on ``--partitions`` partitions of a local
tansu broker, ingested by ``twg stream`` (a subprocess, as deployed) and stopped:

  (a) the baseline: a bare aiokafka consumer with no group reading every record back,
      counting only — the least any check that reads the broker again can cost;
  (b) ``twg verify`` (the shallow check: positions, the broker's offsets);
  (c) ``twg verify --deep`` (every record's key, value, headers and timestamp compared
      with the raw lane's row).

Prints seconds, records/s, the ratio to (a) and the seconds per million records. Not a
test: only ratios within one run mean much on this machine (2 shared cores).

    python load-tests/verify_bench.py --records 1000000 --partitions 4
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

sys.path.insert(0, str(Path(__file__).parent))
from ingest_bench import POLL_S, metric_sums, produce
from thalweg.config import load_config
from thalweg.embedded import TansuBroker, free_port
from thalweg.verify import verify


async def bare_read(bootstrap: str, topic: str, partitions: int, n: int) -> float:
    """Seconds to read every record of ``topic`` from its start without a group."""
    c = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=100
    )
    await c.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        start, seen = time.perf_counter(), 0
        while seen < n:
            got = await c.getmany(timeout_ms=200, max_records=10_000)
            seen += sum(len(v) for v in got.values())
        return time.perf_counter() - start
    finally:
        await c.stop()


def ingest(bootstrap: str, topic: str, n: int, root: Path) -> Path:
    """``twg stream`` over ``topic`` until all ``n`` records are committed; its config."""
    port = free_port()
    cfg = root / "twg.toml"
    cfg.write_text(f"""
[gateway]
data_dir = "{root}/lane"
flight_listen = "grpc://127.0.0.1:0"
http_listen = "127.0.0.1:{port}"

[[sources]]
name = "bench"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "twg-{uuid.uuid4().hex[:6]}"
format = "json"
""")
    cmd = [sys.executable, "-m", "thalweg.cli.main", "--log-level", "warning", "stream"]
    proc = subprocess.Popen([*cmd, "--config", str(cfg)], stdout=subprocess.DEVNULL)
    try:
        while metric_sums(f"http://127.0.0.1:{port}", "twg_partition_committed_position")[0] < n:
            if proc.poll() is not None:
                raise SystemExit(f"twg stream exited with {proc.returncode}")
            time.sleep(POLL_S)
    finally:
        proc.terminate()
        proc.wait(60)
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args()
    n = args.records
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as d:
        topic = f"verify-{uuid.uuid4().hex[:8]}"
        produce(broker.bootstrap, topic, n, args.partitions)
        cfg = load_config(ingest(broker.bootstrap, topic, n, Path(d)))
        runs: dict[str, float] = {}
        runs["(a) bare aiokafka read-back"] = asyncio.run(
            bare_read(broker.bootstrap, topic, args.partitions, n)
        )
        start = time.perf_counter()
        shallow = verify(cfg)
        runs["(b) twg verify"] = time.perf_counter() - start
        start = time.perf_counter()
        deep = verify(cfg, deep=True)
        runs["(c) twg verify --deep"] = time.perf_counter() - start
    assert shallow.ok, shallow.as_text()
    assert deep.ok, deep.as_text()
    compared = sum(d["compared"] for d in deep.deep.values())
    assert compared == n, f"compared {compared} of {n}"
    base = runs["(a) bare aiokafka read-back"]
    print(f"{n:,} records, {args.partitions} partitions")
    for label, secs in runs.items():
        print(
            f"{label:30s} {secs:7.2f} s {n / secs:10,.0f} rec/s  {secs / base:5.2f}x (a)  "
            f"{secs / n * 1e6:6.2f} s per million"
        )


if __name__ == "__main__":
    main()
