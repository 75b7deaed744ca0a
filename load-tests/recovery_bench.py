"""Recovery benchmark: what a sink's replay costs live ingest.

A sink that was down comes back with a backlog in the raw lane while new records keep
arriving. The replay is throttled (``recovery.max_duty``, default 0.5) so that ingest
keeps most of its rate. Measured in one run, on a local tansu broker:

  0. set-up: ``twg stream`` ingests ``--backlog`` JSON records of topic A into a lane
     (role ``ingest``, no sink) — the backlog;
  (a) ``twg stream`` over a copy of that lane ingests ``--records`` of topic B, no sink;
  (b) the same with an Iceberg sink on topic A, whose whole backlog it replays from the
      lane while B is ingested.

Prints B's ingest rate in both runs (first B record consumed → last B record committed),
the ratio (b)/(a), and the replay rate of (b) (Iceberg rows written per second while B
was ingested). Not a test: only the ratio within one run means much.

    python load-tests/recovery_bench.py --backlog 500000 --records 500000
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from ingest_bench import produce
from thalweg.embedded import TansuBroker, free_port


def metric(admin: str, name: str, topic: str | None = None) -> float:
    """A metric summed over its label sets (only ``topic``'s when given)."""
    try:
        with urllib.request.urlopen(admin + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and (topic is None or f'topic="{topic}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def config(data: Path, port: int, bootstrap: str, a: str, b: str, group_a: str, sink: bool) -> str:
    text = f"""
[gateway]
data_dir = "{data}"
flight_listen = "grpc://127.0.0.1:0"
http_listen = "127.0.0.1:{port}"
role = "both"

[raw_lane]
roll_age_s = 1.0

[[sources]]
name = "backlog"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{a}"]
group_id = "{group_a}"
session_timeout_ms = 6000
heartbeat_interval_ms = 1000

[[sources]]
name = "live"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{b}"]
group_id = "live-{uuid.uuid4().hex[:6]}"
session_timeout_ms = 6000
heartbeat_interval_ms = 1000
"""
    if sink:
        text += f"""
[[sinks]]
name = "lake"
kind = "iceberg"
topics = ["{a}"]
commit_interval_s = 1
"""
    return text


def run(cfg_text: str, workdir: Path, port: int, watch: str, n: int) -> dict[str, float]:
    """``twg stream`` until topic ``watch`` has ``n`` records committed."""
    admin = f"http://127.0.0.1:{port}"
    cfg = workdir / f"twg-{port}.toml"
    cfg.write_text(cfg_text)
    cmd = [sys.executable, "-m", "thalweg.cli.main", "--log-level", "warning", "stream"]
    proc = subprocess.Popen([*cmd, "--config", str(cfg)], stdout=subprocess.DEVNULL)
    first = None
    rows_at_first = 0.0
    try:
        while True:
            now = time.perf_counter()
            if first is None and metric(admin, "twg_partition_consumed_position", watch) > 0:
                first = now
                rows_at_first = metric(admin, "twg_sink_rows_written_total")
            if metric(admin, "twg_partition_committed_position", watch) >= n:
                break
            if proc.poll() is not None:
                raise SystemExit(f"twg stream exited with {proc.returncode}")
            time.sleep(0.02)
        assert first is not None
        replayed = metric(admin, "twg_sink_rows_written_total") - rows_at_first
        return {"seconds": now - first, "replayed": replayed}
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--backlog", type=int, default=500_000)
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--partitions", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="recovery-bench-") as tmp:
        root = Path(tmp)
        broker = TansuBroker(log_file=root / "tansu.log").start()
        try:
            a, b = f"backlog-{uuid.uuid4().hex[:6]}", f"live-{uuid.uuid4().hex[:6]}"
            admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 2})
            for t in (a, b):
                admin.create_topics([NewTopic(t, args.partitions, 1)])[t].result(10)
            produce(broker.bootstrap, a, args.backlog, args.partitions)
            produce(broker.bootstrap, b, args.records, args.partitions)
            group_a = f"backlog-{uuid.uuid4().hex[:6]}"
            lane = root / "lane"
            port = free_port()
            # 0: the backlog of A in a lane, committed (B is ingested too: discarded).
            run(
                config(lane, port, broker.bootstrap, a, b, group_a, False),
                root,
                port,
                a,
                args.backlog,
            )
            # The live topic's part of the lane goes: (a) and (b) both ingest B afresh.
            for lane_name in ("raw", "decoded"):
                shutil.rmtree(lane / lane_name / f"topic={b}", ignore_errors=True)
            results = {}
            for label, sink in (("no sink", False), ("sink replaying", True)):
                data = root / f"lane-{label.replace(' ', '-')}"
                shutil.copytree(lane, data)
                port = free_port()
                text = config(data, port, broker.bootstrap, a, b, group_a, sink)
                results[label] = run(text, root, port, b, args.records)
        finally:
            broker.stop()
    base = args.records / results["no sink"]["seconds"]
    with_sink = args.records / results["sink replaying"]["seconds"]
    replay = results["sink replaying"]["replayed"] / results["sink replaying"]["seconds"]
    print(f"backlog={args.backlog:,} live records={args.records:,} partitions={args.partitions}")
    print(f"ingest, no sink:           {base:>10,.0f} rec/s")
    print(f"ingest, sink replaying:    {with_sink:>10,.0f} rec/s   ratio {with_sink / base:.2f}x")
    print(f"replay while ingesting:    {replay:>10,.0f} rec/s into Iceberg (max_duty 0.5)")


if __name__ == "__main__":
    main()
