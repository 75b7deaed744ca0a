"""Live-tail latency: a record's send time → a follow client holding it, per rate.

On a local tansu broker, for each rate and configuration, in one run: a fresh topic,
``twg stream`` in a subprocess, one follow client (``thalweg_client``, decoded lane,
``start="latest"``) and a paced producer (confluent-kafka, ``linger.ms = 1``) writing JSON
records that carry their send time. Every row's latency is the client's clock when its
batch arrived minus that send time (one machine, one clock). The first second of each
run is warm-up and not counted. Prints p50 / p90 / p99 / max per rate.

Configurations: ``default`` (the defaults a user gets) and ``tuned`` (smaller polls:
``max_poll_records = 1000``, ``max_partition_fetch_bytes = 1 MiB``).

Not a test: 2 shared cores here; the producer and the client share them with the
gateway and the broker.

    python load-tests/latency_bench.py --rates 1000,10000 --seconds 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import thalweg_client
from thalweg.embedded import TansuBroker, free_port

CONFIGS = {
    "default": "",
    "tuned": "max_poll_records = 1000\nmax_partition_fetch_bytes = 1048576",
}
WARMUP_S = 1.0


def start_gateway(
    d: Path, bootstrap: str, topic: str, extra: str
) -> tuple[subprocess.Popen[bytes], str]:
    flight = free_port()
    cfg = d / f"{topic}.toml"
    cfg.write_text(
        f"""
[gateway]
data_dir = "{d / topic}"
flight_listen = "grpc://127.0.0.1:{flight}"
http_listen = "127.0.0.1:{free_port()}"

[[sources]]
name = "latency"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "latency-{uuid.uuid4().hex[:6]}"
{extra}
"""
    )
    cmd = [sys.executable, "-m", "thalweg.cli.main", "--log-level", "warning", "stream"]
    proc = subprocess.Popen([*cmd, "--config", str(cfg)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    if not proc.stdout.readline().startswith(b"thalweg"):
        raise SystemExit("twg stream did not start")
    return proc, f"grpc://127.0.0.1:{flight}"


def one_run(bootstrap: str, rate: int, seconds: float, extra: str) -> list[float]:
    topic = f"latency-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "log_level": 2})
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_gateway(Path(tmp), bootstrap, topic, extra)
        try:
            producer.produce(topic, json.dumps({"ts": time.time(), "n": -1}).encode())
            producer.flush(10)
            client = thalweg_client.connect(url)
            deadline = time.monotonic() + 30
            while True:  # a decoded follow needs the topic's first record decoded
                try:
                    reader = client.stream(topic, end="follow", start="latest", columns=["ts"])
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            latencies: list[float] = []
            done = threading.Event()
            counting_from = time.time() + WARMUP_S

            def follow() -> None:
                try:
                    for batch in reader:
                        now = time.time()
                        sent = batch.column(0).to_pylist()
                        latencies.extend(now - s for s in sent if s >= counting_from)
                        if done.is_set():
                            return
                except Exception:
                    if not done.is_set():  # a cancel at the end is how a follow stops
                        raise

            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            step = 0.01  # produce in 10 ms ticks
            per_tick = max(1, int(rate * step))
            end = time.monotonic() + WARMUP_S + seconds
            next_tick = time.monotonic()
            n = 0
            while time.monotonic() < end:
                for _ in range(per_tick):
                    producer.produce(topic, json.dumps({"ts": time.time(), "n": n}).encode())
                    n += 1
                producer.poll(0)
                next_tick += step
                time.sleep(max(0.0, next_tick - time.monotonic()))
            producer.flush(30)
            time.sleep(3.0)  # the tail arrives
            done.set()
            client.close()
            return latencies
        finally:
            proc.terminate()
            proc.wait(30)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="1000,10000")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    with TansuBroker() as broker:
        head = ["rows", "p50", "p90", "p99", "max"]
        print(f"{'config':8s} {'rate':>7s} " + " ".join(f"{h:>8s}" for h in head))
        for name, extra in CONFIGS.items():
            for rate in rates:
                got = one_run(broker.bootstrap, rate, args.seconds, extra)
                if not got:
                    print(f"{name:8s} {rate:7d}   no rows")
                    continue
                ms = [1000 * x for x in got]
                print(
                    f"{name:8s} {rate:7d} {len(ms):8d} {percentile(ms, 0.5):7.0f}ms "
                    f"{percentile(ms, 0.9):7.0f}ms {percentile(ms, 0.99):7.0f}ms {max(ms):7.0f}ms"
                )


if __name__ == "__main__":
    main()
