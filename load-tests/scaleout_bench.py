"""Scale-out benchmark: cold reads from an object store, rebalance time, compaction.

On a local tansu broker and a moto S3 server, in one run:

  (a) **Cold do_get.** ``--records`` JSON records are ingested twice, into a lane on
      local disk and into a bucket. Then a fresh replica (``role = "recovery"``, segment
      cache off) serves the whole topic: over the local lane, and over the bucket with an
      empty cache (it fetches every segment first). Both timed from the replica being up
      to the last row read; the ratio is local / object store.
  (b) **Rebalance time.** Two gateways on one group ingest a paced stream; one is
      SIGKILLed; timed from the kill to the group's committed offset of every partition
      it owned moving on (the new owner committing) — local data_dirs and the bucket.
      The group session is 3 s, which bounds it from below.
  (c) **Compaction throughput.** The local lane of (a), rewritten as segments of 1000
      records (the gateway's segment writer), is compacted in place, against a bare
      baseline over a copy of the same files: ``pyarrow.parquet`` reads every part and
      writes one file per run and lane.

Not a test: only the ratios within one run mean much (2 shared cores here).

    python load-tests/scaleout_bench.py --records 300000
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import committed_offsets  # noqa: E402

import thalweg_client  # noqa: E402
from ingest_bench import make_value, produce  # noqa: E402
from thalweg.config.models import RawLaneConfig  # noqa: E402
from thalweg.config.retention import CompactionConfig  # noqa: E402
from thalweg.embedded import TansuBroker, free_port  # noqa: E402
from thalweg.lane.layout import Lane, LaneLayout  # noqa: E402
from thalweg.lane.upkeep.compaction import merge, plan_runs  # noqa: E402
from thalweg.lane.writer import SegmentWriter  # noqa: E402
from thalweg.records.columns import MetadataColumns  # noqa: E402

PARTITIONS = 4
KEY, SECRET, REGION = "bench", "bench-secret", "us-east-1"


class Moto:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import boto3

        self.s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            region_name=REGION,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.s3.list_buckets()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def bucket(self) -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        self.s3.create_bucket(Bucket=name)
        return f"s3://{name}/lanes"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def lane_lines(moto: Moto, where: str, cache: Path) -> str:
    if not where.startswith("s3://"):
        return f'data_dir = "{where}"'
    return f"""data_dir = "{where}"
[gateway.object_store]
endpoint_url = "{moto.endpoint}"
region = "{REGION}"
access_key_id = "{KEY}"
secret_access_key = "{SECRET}"
cache_dir = "{cache}"
sync_interval_s = 0.5"""


class Gateway:
    """``twg stream`` in a subprocess."""

    def __init__(
        self, d: Path, name: str, lane: str, topic: str, group: str, bootstrap: str, extra: str
    ) -> None:
        self.flight, self.http = free_port(), free_port()
        self.admin = f"http://127.0.0.1:{self.http}"
        self.url = f"grpc://127.0.0.1:{self.flight}"
        cfg = d / f"{name}.toml"
        gateway, _, store = lane.partition("\n[gateway.object_store]")
        cfg.write_text(
            f"""
[gateway]
flight_listen = "grpc://127.0.0.1:{self.flight}"
http_listen = "127.0.0.1:{self.http}"
gc_tuning = true
{gateway}
{extra}
{"[gateway.object_store]" + store if store else ""}

[gateway.flight]
segment_cache_bytes = 0

[raw_lane]
roll_age_s = 0.2

[[sources]]
name = "bench"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "{group}"
session_timeout_ms = 3000
heartbeat_interval_ms = 500
"""
        )
        cmd = [sys.executable, "-m", "thalweg.cli.main", "--log-level", "warning", "stream"]
        self.proc = subprocess.Popen(
            [*cmd, "--config", str(cfg)],
            stdout=subprocess.PIPE,
            stderr=open(d / f"{name}.log", "ab"),  # noqa: SIM115
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith(b"thalweg"):
            raise SystemExit(f"{name} did not start: {(d / f'{name}.log').read_text()[-2000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(60)


def new_topic(bootstrap: str, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
    return name


def owners(gw: Gateway, topic: str) -> dict[str, str]:
    """The group's partition → owner map as ``gw`` last received it (its /stats)."""
    with urllib.request.urlopen(gw.admin + "/stats", timeout=5) as r:
        found: dict[str, str] = json.load(r)["group"]["owners"].get(topic, {})
    return found


def wait_committed(bootstrap: str, group: str, topic: str, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while sum(committed_offsets(bootstrap, group, topic, range(PARTITIONS)).values()) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"{group}: not all {n} committed in {timeout}s")
        time.sleep(0.2)


def ingest(d: Path, name: str, lane: str, topic: str, bootstrap: str, n: int) -> None:
    group = f"{name}-{uuid.uuid4().hex[:6]}"
    gw = Gateway(d, name, lane, topic, group, bootstrap, "")
    try:
        wait_committed(bootstrap, group, topic, n, 600)
    finally:
        gw.stop()


def cold_read(d: Path, name: str, lane: str, topic: str, bootstrap: str, n: int) -> float:
    """A fresh recovery-only replica, up → the whole topic read through it."""
    gw = Gateway(d, name, lane, topic, f"reader-{name}", bootstrap, 'role = "recovery"')
    try:
        started = time.perf_counter()
        with thalweg_client.connect(gw.url) as client:
            while True:
                try:
                    rows = client.read(topic).num_rows
                except Exception:
                    rows = 0  # not synced far enough yet
                if rows >= n:
                    return time.perf_counter() - started
                time.sleep(0.05)
    finally:
        gw.stop()


def rebalance(d: Path, lane: str, cache: Path, moto: Moto, bootstrap: str) -> float:
    """Kill one of two members; seconds until the survivor committed its partitions."""
    topic = new_topic(bootstrap, "rebalance")
    group = f"rb-{uuid.uuid4().hex[:6]}"
    stop = threading.Event()

    def paced() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10, "log_level": 2})
        i = 0
        while not stop.is_set():
            for _ in range(100):
                p.produce(topic, make_value(i), partition=i % PARTITIONS)
                i += 1
            p.poll(0)
            time.sleep(0.05)  # ~2k records/s
        p.flush(30)

    producer = threading.Thread(target=paced, daemon=True)
    producer.start()

    def place(n: str) -> str:
        where = lane if lane.startswith("s3://") else f"{lane}-{n}"
        return lane_lines(moto, where, cache / f"rb-{n}")

    members = [Gateway(d, f"rb-{n}", place(n), topic, group, bootstrap, "") for n in "ab"]
    try:
        deadline = time.monotonic() + 60
        while len(set(owners(members[0], topic).values())) < 2:
            if time.monotonic() > deadline:
                raise SystemExit("the two members never shared the topic")
            time.sleep(0.2)
        time.sleep(3.0)  # both committing
        theirs = [int(p) for p, loc in owners(members[0], topic).items() if loc == members[1].url]
        members[1].stop(signal.SIGKILL)
        killed = time.perf_counter()
        marks = committed_offsets(bootstrap, group, topic, theirs)
        while True:
            now = committed_offsets(bootstrap, group, topic, theirs)
            if all(now[p] > marks[p] for p in theirs):
                return time.perf_counter() - killed
            if time.perf_counter() - killed > 120:
                raise SystemExit("no new owner committed within 120 s")
            time.sleep(0.05)
    finally:
        stop.set()
        producer.join(30)
        for m in members:
            m.stop(signal.SIGKILL)


def small_segments(lane: Path, out: Path, topic: str, rows: int) -> int:
    """``lane``'s records rewritten as segments of ``rows`` records (what a 5 s roll
    leaves on a quiet topic), through the gateway's own segment writer."""
    src, layout = LaneLayout(lane), LaneLayout(out)
    layout.claim("_twg_")
    writer = SegmentWriter(layout, MetadataColumns("_twg_"), RawLaneConfig())
    files = 0
    for p in range(PARTITIONS):
        for seg in src.segments(Lane.RAW, topic, p):
            raw = pq.read_table(seg.path)
            decoded = pq.read_table(src.partition_dir(Lane.DECODED, topic, p) / seg.path.name)
            for i in range(0, raw.num_rows, rows):
                piece = raw.slice(i, rows)
                pos = piece.column("_twg_position")
                writer.write(
                    topic, p, piece, decoded.slice(i, rows),
                    pos[0].as_py(), pos[-1].as_py() + 1,
                )  # fmt: skip
                files += 1
    return files


def compaction(lane: Path, topic: str) -> tuple[float, float, int, int]:
    """(thalweg seconds, bare seconds, runs, bytes merged) over copies of one lane."""
    small = lane.parent / "compact-small"
    small_segments(lane, small, topic, 1000)
    ours, bare = lane.parent / "compact-ours", lane.parent / "compact-bare"
    shutil.copytree(small, ours)
    shutil.copytree(small, bare)
    cfg = CompactionConfig(enabled=True, min_age_s=0, min_files=2)
    raw_cfg = RawLaneConfig()
    layout = LaneLayout(ours)
    plans = {p: plan_runs(layout, topic, p, cfg, time.time()) for p in range(PARTITIONS)}
    nbytes = sum(
        (layout.partition_dir(lane_, topic, p) / s.path.name).stat().st_size
        for p, runs in plans.items()
        for run in runs
        for s in run
        for lane_ in (Lane.RAW, Lane.DECODED)
        if (layout.partition_dir(lane_, topic, p) / s.path.name).exists()
    )
    runs = sum(len(run) for r in plans.values() for run in r)
    started = time.perf_counter()
    for p, p_runs in plans.items():
        for run in p_runs:
            merge(layout, topic, p, run, raw_cfg)
    ours_s = time.perf_counter() - started

    bare_layout = LaneLayout(bare)
    started = time.perf_counter()
    for p, p_runs in plans.items():
        for run in p_runs:
            for lane_ in (Lane.DECODED, Lane.RAW):
                directory = bare_layout.partition_dir(lane_, topic, p)
                parts = [directory / s.path.name for s in run if (directory / s.path.name).exists()]
                if parts:
                    table = pa.concat_tables([pq.read_table(x) for x in parts])
                    pq.write_table(
                        table, directory / f"merged-{run[0].first}.parquet",
                        compression="zstd", compression_level=1,
                    )  # fmt: skip
    bare_s = time.perf_counter() - started
    return ours_s, bare_s, runs, nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rebalances", type=int, default=2)
    parser.add_argument(
        "--only", choices=["a", "b", "c"], help="run one part: (a) cold reads, (b), (c)"
    )
    args = parser.parse_args()
    n = args.records
    moto = Moto()
    try:
        with TansuBroker() as broker, tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            bootstrap = broker.bootstrap
            topic = new_topic(bootstrap, "scaleout")
            nbytes = produce(bootstrap, topic, n, PARTITIONS)
            print(f"{n} records, {nbytes / 1e6:.0f} MB of JSON values, {PARTITIONS} partitions")
            local, bucket = d / "local", moto.bucket()
            ingest(d, "local", lane_lines(moto, str(local), d / "x"), topic, bootstrap, n)
            if args.only in (None, "a"):
                ingest(d, "s3", lane_lines(moto, bucket, d / "cache-ingest"), topic, bootstrap, n)
            files = sum(len(LaneLayout(local).segments(Lane.RAW, topic, p)) for p in range(4))
            if args.only in (None, "a"):
                print(f"(a) cold do_get of the whole topic ({files} raw segments per lane)")
            for attempt in range(2 if args.only in (None, "a") else 0):
                t_local = cold_read(
                    d, f"cold-local-{attempt}", lane_lines(moto, str(local), d / "x"),
                    topic, bootstrap, n,
                )  # fmt: skip
                t_s3 = cold_read(
                    d, f"cold-s3-{attempt}",
                    lane_lines(moto, bucket, d / f"cache-cold-{attempt}"), topic, bootstrap, n,
                )  # fmt: skip
                print(
                    f"    local disk {t_local:6.2f} s ({n / t_local:9,.0f} rows/s)   object store "
                    f"{t_s3:6.2f} s ({n / t_s3:9,.0f} rows/s)   ratio {t_local / t_s3:.2f}x"
                )
            if args.only in (None, "b"):
                print("(b) rebalance: SIGKILL of one of two members -> the survivor committing")
            for attempt in range(args.rebalances if args.only in (None, "b") else 0):
                for kind, lane in (
                    ("local", str(d / f"rb-local-{attempt}")),
                    ("s3", moto.bucket()),
                ):
                    took = rebalance(d, lane, d / f"rb-cache-{attempt}-{kind}", moto, bootstrap)
                    print(f"    {kind:5s} {took:5.2f} s (session timeout 3 s)")
            if args.only not in (None, "c"):
                return
            ours, bare, runs, merged = compaction(local, topic)
            print(
                f"(c) compaction of {runs} segments of 1000 records "
                f"({merged / 1e6:.0f} MB, raw+decoded): "
                f"{ours:.2f} s ({merged / ours / 1e6:.0f} MB/s), bare pyarrow {bare:.2f} s "
                f"({merged / bare / 1e6:.0f} MB/s), ratio {bare / ours:.2f}x"
            )
    finally:
        moto.stop()


if __name__ == "__main__":
    main()
