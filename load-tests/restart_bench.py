"""Restart time: ``twg stream`` SIGKILLed with many segments per partition, then started
again, timed to ``/ready`` 200.

On a local tansu broker, in one run: a topic of ``--partitions`` partitions is ingested
with ``roll_rows`` set so each partition has ``--segments`` segments (raw, decoded and
their Arrow IPC copies), the gateway is SIGKILLed, and a new one started on the same
data_dir. Printed: seconds from the start to the process's start-up line and to ``/ready``; the
same for a gateway on an empty data_dir in the same group, also started after a SIGKILL
of its predecessor (the baseline: the group's join, which waits for the killed member's
session to expire), and the difference — what the lane's start-up adds. With
``--profile FILE`` the restarted gateway runs under py-spy (collapsed stacks).

    python load-tests/restart_bench.py --partitions 4 --segments 100
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from thalweg.embedded import TansuBroker, free_port

ROWS_PER_SEGMENT = 1000


def config(d: Path, name: str, bootstrap: str, topic: str, data: Path) -> tuple[Path, int]:
    http = free_port()
    cfg = d / f"{name}.toml"
    cfg.write_text(
        f"""
[gateway]
data_dir = "{data}"
flight_listen = "grpc://127.0.0.1:{free_port()}"
http_listen = "127.0.0.1:{http}"

[raw_lane]
roll_rows = {ROWS_PER_SEGMENT}
roll_age_s = 60

[[sources]]
name = "restart"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "restart-{uuid.uuid4().hex[:6]}"
session_timeout_ms = 6000
heartbeat_interval_ms = 1000
"""
    )
    return cfg, http


def status(http: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}{path}", timeout=1) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def durable(http: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("twg_partition_durable_position{")
        )
    )


def start(cfg: Path, log: Path, profile: Path | None) -> tuple[subprocess.Popen[bytes], float]:
    cmd = [sys.executable, "-m", "thalweg.cli.main", "--log-level", "info", "stream"]
    if profile is not None:
        cmd = ["py-spy", "record", "-f", "raw", "-r", "100", "-o", str(profile), "--", *cmd]
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*cmd, "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=open(log, "ab"),  # noqa: SIM115 - the child owns it
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc, started


def timed_start(
    cfg: Path, http: int, log: Path, profile: Path | None, *, kill_after: bool
) -> dict[str, float]:
    proc, started = start(cfg, log, profile)
    up = time.perf_counter() - started
    while status(http, "/ready") != 200:
        if time.perf_counter() - started > 120:
            raise SystemExit(f"not ready in 120 s; {log}")
        time.sleep(0.05)
    ready = time.perf_counter() - started
    if profile is not None:  # py-spy writes its profile on SIGINT (the gateway stops too)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    else:
        proc.send_signal(signal.SIGKILL if kill_after else signal.SIGTERM)
        proc.wait(60)
    return {"up": up, "ready": ready}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--segments", type=int, default=100)
    parser.add_argument("--profile", type=Path)
    args = parser.parse_args()
    n = args.partitions * args.segments * ROWS_PER_SEGMENT
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        topic = f"restart-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 2})
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "log_level": 2})
        for i in range(n):
            p.produce(
                topic,
                json.dumps({"n": i, "note": "x" * 100}).encode(),
                partition=i % args.partitions,
            )
            if i % 10_000 == 0:
                p.poll(0)
        p.flush(120)
        data = d / "data"
        cfg, http = config(d, "gw", broker.bootstrap, topic, data)
        proc, _ = start(cfg, d / "first.log", None)
        while durable(http) < n:
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        segments = len(list((data / "raw").rglob("*.parquet")))
        # (a) the same data_dir after the kill; (b) an empty data_dir of the same group
        # after a kill of (a) — both wait for the killed member's session to expire.
        again = timed_start(cfg, http, d / "again.log", args.profile, kill_after=True)
        empty_cfg = d / "empty.toml"
        empty_cfg.write_text(cfg.read_text().replace(str(data), str(d / "empty")))
        empty = timed_start(empty_cfg, http, d / "empty.log", None, kill_after=True)
        print(f"{args.partitions} partitions, {segments} raw segments, {n:,} records")
        print("  both after a SIGKILL of the group's member (its 6 s session expires first)")
        for name, t in (("lane of 100/part", again), ("empty data_dir", empty)):
            print(f"  {name:17s} process up {t['up']:5.2f} s   /ready {t['ready']:5.2f} s")
        print(f"  what the lane adds: {again['ready'] - empty['ready']:+.2f} s")


if __name__ == "__main__":
    main()
