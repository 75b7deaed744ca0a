"""Pulsar ingest benchmark: Thalweg's raw lane against a bare pulsar-client consume loop.

Produces N JSON messages (~200 B, batched) to a fresh topic on a local pulsar-lite
broker, then measures in the same run:

  (a) baseline: a bare pulsar-client ``receive`` loop on its own subscription that only
      counts distinct message ids (pulsar-lite dispatches some messages more than once;
      one cumulative acknowledgement at the end);
  (b) thalweg:  ``twg stream`` (a subprocess, as deployed) with a Pulsar source until the
      raw lane holds all N messages durably and they are acknowledged.

Each runs ``--repeats`` times, interleaved, on its own subscription of the same topic;
the best of each is kept. Prints messages/s of both and the ratio (a)/(b). Not a test:
machines here are noisy, so only the ratio within one run means much.

    python load-tests/pulsar_bench.py --records 300000
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.pulsar_lite import PulsarLite

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
sys.path.insert(0, str(Path(__file__).parent))
from ingest_bench import make_value, time_stream  # noqa: E402


def produce(url: str, topic: str, n: int) -> int:
    client = pulsar.Client(url, logger=QUIET)
    total = 0
    try:
        p = client.create_producer(
            f"persistent://public/default/{topic}",
            batching_enabled=True,
            batching_max_messages=1000,
            batching_max_publish_delay_ms=10,
            block_if_queue_full=True,
            max_pending_messages=50_000,
        )
        for i in range(n):
            v = make_value(i)
            total += len(v)
            p.send_async(v, None)
        p.flush()
        p.close()
    finally:
        client.close()
    return total


def subscribe_from_start(client: pulsar.Client, topic: str, name: str, queue: int) -> Any:
    """A failover consumer on a fresh subscription, from the topic's first message."""
    return client.subscribe(
        f"persistent://public/default/{topic}",
        f"{name}-{uuid.uuid4().hex[:6]}",
        consumer_type=pulsar.ConsumerType.Failover,
        initial_position=pulsar.InitialPosition.Earliest,
        receiver_queue_size=queue,
    )


def bare(url: str, topic: str, n: int, queue: int) -> float:
    """Seconds from the first message to the n-th, counting only."""
    client = pulsar.Client(url, logger=QUIET)
    try:
        c = subscribe_from_start(client, topic, "bare", queue)
        start = None
        seen: set[bytes] = set()
        last = None
        # Distinct ids: pulsar-lite dispatches some messages more than once.
        while len(seen) < n:
            last = c.receive(timeout_millis=10_000)
            if start is None:
                start = time.perf_counter()
            seen.add(last.message_id().serialize())
        elapsed = time.perf_counter() - (start or time.perf_counter())
        c.acknowledge_cumulative(last)
        c.close()
        return elapsed
    finally:
        client.close()


def thalweg(
    url: str, topic: str, n: int, fmt: str, roll_age: float, queue: int
) -> tuple[float, float]:
    """(first consumed -> all consumed, first consumed -> all durable and acknowledged)."""
    source = f"""name = "bench"
kind = "pulsar"
service_url = "{url}"
topics = ["{topic}"]
subscription = "twg-{uuid.uuid4().hex[:6]}"
format = "{fmt}"
receiver_queue_size = {queue}"""
    # Pulsar positions are packed ids, not counts: count records instead.
    run = time_stream(source, n, roll_age, "twg_source_records_total", "twg_raw_rows_written_total")
    return run.consume_s, run.commit_s


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--format", choices=["json", "none"], default="json")
    ap.add_argument("--roll-age", type=float, default=5.0)
    ap.add_argument("--queue", type=int, default=1000, help="receiver_queue_size of both")
    ap.add_argument(
        "--repeats", type=int, default=1, help="runs of each, interleaved (best of each kept)"
    )
    args = ap.parse_args()
    n = args.records
    with tempfile.TemporaryDirectory() as d:
        broker = PulsarLite(Path(d) / "pulsar")
        try:
            topic = f"bench-{uuid.uuid4().hex[:8]}"
            t = time.perf_counter()
            value_bytes = produce(broker.url, topic, n)
            print(f"produced {n:,} messages ({value_bytes / n:.0f} B avg) in "
                  f"{time.perf_counter() - t:.1f}s")  # fmt: skip
            base = consume_s = durable_s = float("inf")
            for _ in range(args.repeats):  # interleaved, best of each: the machine is noisy
                base = min(base, bare(broker.url, topic, n, args.queue))
                run = thalweg(broker.url, topic, n, args.format, args.roll_age, args.queue)
                consume_s, durable_s = min(consume_s, run[0]), min(durable_s, run[1])
        finally:
            broker.stop()
    mb = value_bytes / 1e6
    py = platform.python_version()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {py}, pulsar-lite")
    print(
        f"settings: {n:,} messages, format={args.format}, roll_age_s={args.roll_age}, "
        f"receiver_queue_size={args.queue}, best of {args.repeats}"
    )
    for label, secs in (
        ("(a) bare pulsar-client receive, count", base),
        ("(b) twg stream: consumed into Arrow", consume_s),
        ("(b) twg stream: durable + acknowledged", durable_s),
    ):
        print(f"{label:40} {n / secs:10,.0f} msg/s {mb / secs:7.1f} MB/s ({secs:.2f}s)")
    print(f"ratio consumed/(a): {base / consume_s:.2f}   durable/(a): {base / durable_s:.2f}")


if __name__ == "__main__":
    main()
