"""Live-tail latency: a record's send time → a follow client holding it, in users' shapes.

On a local tansu broker, for each shape, in one run: a fresh topic of ``P`` partitions,
``G`` gateways (``twg stream`` subprocesses, one consumer group, a data_dir each), one
follow client (``thalweg_client``, decoded lane, ``start="latest"``, all columns or one)
and a paced producer (confluent-kafka, ``linger.ms = 1``, records spread round-robin over
the partitions) writing ~250-byte JSON orders that carry their send time. Every row's
latency is the client's clock when its batch arrived minus that send time (one machine,
one clock). The first second is warm-up and not counted. Each shape prints p50 / p90 /
p99 / max, the rows counted, and the records still missing 3 s after the producer
stopped (``late``) and any duplicates (``dup``).

Shapes are the cross product of ``--partitions``, ``--rates``, ``--columns`` and
``--gateways``. With three gateways the client reads each partition at its owner
(``thalweg_client.spread``). Extra modes:

* ``--kill``: SIGKILL one gateway halfway (three gateways): the stream must go on with
  no gap and no duplicate (``late`` and ``dup`` stay 0 once the group settled).
* ``--slow-reader``: a second follow client on the same gateway that sleeps 50 ms
  after every batch; the normal client's figures are printed beside a run without it.
* ``--busy N``: N processes spinning on the CPU meanwhile (a busy machine).

Not a test: 2 shared cores here; the producer and the client share them with the
gateways and the broker.

    python load-tests/latency_bench.py --partitions 1,4,12,32 --rates 10000
    python load-tests/latency_bench.py --partitions 12 --gateways 3 --kill
    python load-tests/latency_bench.py --partitions 4 --slow-reader
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from aiokafka import AIOKafkaConsumer
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import thalweg_client
from thalweg.embedded import TansuBroker, free_port

WARMUP_S = 1.0
TAIL_S = 3.0
SLOW_READER_SLEEP_S = 0.05
LINGER_MS = int(os.environ.get("LINGER_MS", "20"))


def order(n: int, ts: float) -> bytes:
    """One order with its send time: ten fields, about 250 bytes."""
    return json.dumps(
        {
            "ts": ts,
            "n": n,
            "order_id": f"o-{n:09d}",
            "customer": f"customer-{n % 9973:05d}",
            "item": "lantern",
            "quantity": n % 7 + 1,
            "amount": round((n % 1000) * 1.37, 2),
            "currency": "EUR",
            "created_at": "2026-11-30T12:00:00Z",
            "note": "x" * 60,
        }
    ).encode()


class Gateway:
    """``twg stream`` in a subprocess, with its own data_dir."""

    def __init__(self, d: Path, name: str, bootstrap: str, topic: str, group: str) -> None:
        self.flight, self.http = free_port(), free_port()
        self.url = f"grpc://127.0.0.1:{self.flight}"
        cfg = d / f"{name}.toml"
        cfg.write_text(
            f"""
[gateway]
data_dir = "{d / name}"
flight_listen = "{self.url}"
http_listen = "127.0.0.1:{self.http}"

[[sources]]
name = "latency"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "{group}"
session_timeout_ms = 6000
heartbeat_interval_ms = 1000
{os.environ.get("TWG_BENCH_SOURCE_EXTRA", "")}
{os.environ.get("TWG_BENCH_EXTRA", "")}
"""
        )
        cmd = [sys.executable, "-m", "thalweg.cli.main", "--log-level", "warning", "stream"]
        self.log = open(d / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*cmd, "--config", str(cfg)], stdout=subprocess.DEVNULL, stderr=self.log
        )

    def ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.http}/ready"
            with urllib.request.urlopen(url, timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def owned(self) -> int:
        """Partitions this member holds (from /health)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/health", timeout=1) as r:
                body = json.loads(r.read())
        except OSError:
            return 0
        return sum(
            len(c.get("partitions", []) or [])
            for c in body.get("components", {}).values()
            if isinstance(c, dict)
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@dataclass
class Follow:
    """A follow client's counts: latencies of rows sent after the warm-up, every n."""

    counting_from: float
    sleep_s: float = 0.0
    latencies: list[np.ndarray] = field(default_factory=list)
    sent: list[np.ndarray] = field(default_factory=list)
    stages: list[np.ndarray] = field(default_factory=list)
    seen: list[np.ndarray] = field(default_factory=list)
    error: BaseException | None = None

    def run(self, reader: pa.RecordBatchReader, done: threading.Event) -> None:
        try:
            for batch in reader:
                now = time.time()
                ts = batch.column("ts").to_numpy(zero_copy_only=False)
                keep = ts >= self.counting_from
                kept = ts[keep]
                self.latencies.append(now - kept)
                self.sent.append(kept)
                if "_twg_emit_ts" in batch.schema.names:
                    ingest = batch.column("_twg_ingest_ts").cast("int64").to_numpy() / 1e6
                    emit = batch.column("_twg_emit_ts").cast("int64").to_numpy() / 1e6
                    self.stages.append(
                        np.stack([ingest[keep] - kept, emit[keep] - ingest[keep], now - emit[keep]])
                    )
                if "n" in batch.schema.names:
                    self.seen.append(batch.column("n").to_numpy(zero_copy_only=False))
                if done.is_set():
                    return
                if self.sleep_s:
                    time.sleep(self.sleep_s)
        except Exception as exc:
            if not done.is_set():  # a cancel at the end is how a follow stops
                self.error = exc

    def breakdown(self) -> str:
        """With ``metadata="all"``: p50/p99 of send → ingest (broker, fetch), ingest →
        emit (the gateway: decode, live tail, the stream's pass) and emit → client."""
        if not self.stages:
            return ""
        st = 1000 * np.concatenate(self.stages, axis=1)
        names = ("broker+fetch", "gateway", "flight+client")
        return " ".join(
            f"{n} {np.percentile(st[i], 50):.0f}/{np.percentile(st[i], 99):.0f}ms"
            for i, n in enumerate(names)
        )

    def timeline(self) -> str:
        """p99 per second of sending: where the slow records were sent."""
        if not self.sent:
            return ""
        sent, ms = np.concatenate(self.sent), 1000 * np.concatenate(self.latencies)
        second = (sent - sent.min()).astype(int)
        return " ".join(
            f"{np.percentile(ms[second == s], 99):.0f}" for s in range(second.max() + 1)
        )

    def figures(self, sent: int) -> dict[str, float]:
        ms = 1000 * np.concatenate(self.latencies) if self.latencies else np.zeros(0)
        got = np.concatenate(self.seen) if self.seen else np.zeros(0, dtype=np.int64)
        got = got[got >= 0]
        unique = np.unique(got)
        out = {"rows": float(len(ms)), "late": float(sent - len(unique))}
        out["dup"] = float(len(got) - len(unique))
        for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100)):
            out[name] = float(np.percentile(ms, q)) if len(ms) else float("nan")
        return out


def spin() -> None:
    """Keep one core busy (``--busy``: the machine has other work)."""
    n = 0
    while True:
        n += 1


def wait_for(check: object, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


@dataclass(frozen=True)
class Shape:
    partitions: int
    rate: int
    columns: str
    gateways: int
    kill: bool = False
    slow_reader: bool = False

    def label(self) -> str:
        extra = " kill" if self.kill else ""
        extra += " +slow" if self.slow_reader else ""
        return f"P={self.partitions:<3d} G={self.gateways} {self.columns:4s}{extra}"


def paced(
    producer: Producer,
    topic: str,
    shape: Shape,
    seconds: float,
    each_tick: Callable[[float], None] = lambda _elapsed: None,
) -> int:
    """Produce ``shape.rate`` orders a second for the warm-up and ``seconds``, in 10 ms
    ticks, round-robin over the partitions; how many were sent."""
    step = 0.01
    per_tick = max(1, int(shape.rate * step))
    started = time.monotonic()
    end = started + WARMUP_S + seconds
    next_tick = started
    n = 0
    while time.monotonic() < end:
        now = time.time()
        for _ in range(per_tick):
            producer.produce(topic, order(n, now), partition=n % shape.partitions)
            n += 1
        producer.poll(0)
        each_tick(time.monotonic() - started)
        next_tick += step
        time.sleep(max(0.0, next_tick - time.monotonic()))
    producer.flush(30)
    return n


def new_topic(bootstrap: str, partitions: int) -> tuple[str, Producer]:
    topic = f"latency-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    settings = {"linger.ms": LINGER_MS, "log_level": 2, "batch.size": 1 << 20}
    return topic, Producer({"bootstrap.servers": bootstrap, **settings})


def bare_run(bootstrap: str, shape: Shape, seconds: float) -> dict[str, float]:
    """The baseline: a bare aiokafka consumer-group member (the gateway's fetch wait,
    50 ms) on the same shape, each record's latency taken when ``getmany`` returns it."""
    topic, producer = new_topic(bootstrap, shape.partitions)
    for p in range(shape.partitions):
        producer.produce(topic, order(-1, time.time()), partition=p)
    producer.flush(10)
    counting_from = float("inf")  # set once the member holds its partitions
    latencies: list[float] = []
    seen: list[int] = []
    ready, done = threading.Event(), threading.Event()

    async def consume() -> None:
        c = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=f"bare-{uuid.uuid4().hex[:6]}",
            auto_offset_reset="latest",
            enable_auto_commit=False,
            fetch_max_wait_ms=50,
        )
        await c.start()
        try:
            while not done.is_set():
                got = await c.getmany(timeout_ms=100, max_records=10_000)
                if c.assignment():
                    ready.set()
                now = time.time()
                for records in got.values():
                    for r in records:
                        doc = json.loads(r.value)
                        if doc["ts"] >= counting_from:
                            latencies.append(now - doc["ts"])
                        seen.append(doc["n"])
        finally:
            await c.stop()

    thread = threading.Thread(target=lambda: asyncio.run(consume()), daemon=True)
    thread.start()
    ready.wait(60)
    time.sleep(1.0)  # the group settles
    counting_from = time.time() + WARMUP_S
    n = paced(producer, topic, shape, seconds)
    time.sleep(TAIL_S)
    done.set()
    thread.join(10)
    follow = Follow(counting_from)
    follow.latencies.append(np.array(latencies))
    follow.seen.append(np.array(seen, dtype=np.int64))
    return follow.figures(n)


def one_run(
    bootstrap: str, shape: Shape, seconds: float, profile: Path | None = None
) -> dict[str, float]:
    topic, producer = new_topic(bootstrap, shape.partitions)
    group = f"latency-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as tmp:
        gateways = [
            Gateway(Path(tmp), f"gw{i}", bootstrap, topic, group) for i in range(shape.gateways)
        ]
        try:
            for p in range(shape.partitions):  # every partition decoded once: a schema
                producer.produce(topic, order(-1, time.time()), partition=p)
            producer.flush(10)
            wait_for(lambda: all(g.ready() for g in gateways), "the gateways' /ready")
            client = thalweg_client.connect(gateways[0].url)
            columns = None if shape.columns == "all" else ["ts", "n"]
            meta = {"metadata": "all"} if os.environ.get("BREAKDOWN") else {}

            def open_stream() -> pa.RecordBatchReader:
                deadline = time.monotonic() + 60
                while True:  # a decoded follow needs every partition's schema
                    try:
                        return client.stream(
                            topic, end="follow", start="latest", columns=columns, **meta
                        )
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.3)

            time.sleep(1.0 if shape.gateways == 1 else 3.0)  # the group settles
            counting_from = time.time() + WARMUP_S
            done = threading.Event()
            main = Follow(counting_from)
            threads = [threading.Thread(target=main.run, args=(open_stream(), done))]
            if shape.slow_reader:
                slow = Follow(counting_from, sleep_s=SLOW_READER_SLEEP_S)
                threads.append(threading.Thread(target=slow.run, args=(open_stream(), done)))
            for t in threads:
                t.daemon = True
                t.start()
            spy = None
            if profile is not None:  # py-spy on the first gateway, collapsed stacks
                out = profile / f"{shape.label().replace(' ', '_').replace('=', '')}.txt"
                spy = subprocess.Popen(
                    [
                        "py-spy",
                        "record",
                        "-f",
                        "raw",
                        "-t",
                        "-r",
                        "50",
                        "-d",
                        str(int(seconds)),
                        "-o",
                        str(out),
                        "--pid",
                        str(gateways[0].proc.pid),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            killed: list[bool] = []

            def kill_halfway(elapsed: float) -> None:
                if shape.kill and not killed and elapsed > seconds / 2:
                    gateways[-1].proc.send_signal(signal.SIGKILL)
                    killed.append(True)

            n = paced(producer, topic, shape, seconds, kill_halfway)
            if spy is not None:
                spy.wait(60)
            time.sleep(TAIL_S if not shape.kill else 3 * TAIL_S)
            done.set()
            client.close()
            for t in threads:
                t.join(5)
            if main.error is not None:
                print(f"  follow client failed: {main.error!r}", file=sys.stderr)
            if os.environ.get("TIMELINE"):
                print("  p99 by second:", main.timeline(), file=sys.stderr)
            if main.stages:
                print("  p50/p99 by stage:", main.breakdown(), file=sys.stderr)
            return main.figures(n)
        finally:
            for g in gateways:
                g.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="1,4,12,32")
    parser.add_argument("--rates", default="10000")
    parser.add_argument("--columns", default="all", help="all, one, or all,one")
    parser.add_argument("--gateways", default="1", help="1, 3, or 1,3")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--kill", action="store_true", help="SIGKILL one gateway halfway")
    parser.add_argument("--slow-reader", action="store_true", help="pair with a slow reader")
    parser.add_argument("--busy", type=int, default=0, help="CPU-spinning processes")
    parser.add_argument("--profile", type=Path, help="py-spy the first gateway into this dir")
    parser.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="skip the bare aiokafka consumer run of each shape",
    )
    args = parser.parse_args()
    shapes = [
        Shape(int(p), int(r), c, int(g), kill=args.kill)
        for g, p, r, c in itertools.product(
            args.gateways.split(","),
            args.partitions.split(","),
            args.rates.split(","),
            args.columns.split(","),
        )
    ]
    if args.slow_reader:
        shapes = [
            s for base in shapes for s in (base, Shape(**{**base.__dict__, "slow_reader": True}))
        ]
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for s in spinners:
        s.start()
    print(f"cpus={os.cpu_count()} busy={args.busy} seconds={args.seconds}")
    try:
        with TansuBroker() as broker:
            head = ["rows", "p50", "p90", "p99", "max", "late", "dup"]
            print(f"{'shape':24s} {'rate':>7s} {'who':7s} " + " ".join(f"{h:>8s}" for h in head))
            for shape in shapes:
                runs = [("thalweg", one_run(broker.bootstrap, shape, args.seconds, args.profile))]
                if args.baseline and not (shape.kill or shape.slow_reader):
                    runs.append(("bare", bare_run(broker.bootstrap, shape, args.seconds)))
                for who, f in runs:
                    print(
                        f"{shape.label():24s} {shape.rate:7d} {who:7s} {int(f['rows']):8d} "
                        + " ".join(f"{f[k]:6.0f}ms" for k in ("p50", "p90", "p99", "max"))
                        + f" {int(f['late']):8d} {int(f['dup']):8d}",
                        flush=True,
                    )
    finally:
        for s in spinners:
            s.terminate()


if __name__ == "__main__":
    main()
