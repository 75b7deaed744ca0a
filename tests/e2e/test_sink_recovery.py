"""The plan's Phase 5b exit, and crash exactness with secondary sinks.

1. A gateway with an Iceberg and a Postgres sink on one topic. PostgreSQL is stopped for
   over 20 s while records flow: ingest, commits and the Iceberg sink go on, /ready
   stays 200, the Postgres gaps show in the coverage store and the lag metric. Then the
   broker is stopped — nothing can be read from the source again — and PostgreSQL comes
   back: recovery from the raw lane brings it to parity. Both sinks hold every produced
   record exactly once and equal the decoded lane row for row.
2. ``twg stream`` with both sinks and four routed ones — an Iceberg sink with a table
   per field value (``"shard_{shard}"``: a flush lands table by table, then its control
   record), a Postgres sink the same way (one transaction), an Arrow IPC sink with a
   directory per value (then its control directory) and a Flight sink with a path per
   value — is SIGKILLed five times during ingest; each exactly-once sink ends with every
   record once, the Flight receiver with every record at its path (at least once).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyarrow import flight
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchTableError

from tests.conftest import RunningGateway, source_cfg
from tests.e2e.test_crash_exactness import config_text, start_gateway, wait_started
from tests.helpers import assert_verified, iceberg_catalog, safe_count, seeded_rng, wait_until
from tests.postgres_server import PostgresServer
from thalweg.embedded import TansuBroker
from thalweg.lane import LaneLayout, scan_coverage
from thalweg.recovery import CoverageStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RID = "_twg_record_id"
PARTITIONS = 2
SHARDS = 3  # a routed Iceberg sink's tables ("shard_{shard}")


def _table(topic: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in topic)


def iceberg(data: Path, topic: str) -> pa.Table:
    home = (data / "sinks" / "lake").resolve()
    cat = load_catalog(
        "lake",
        **{
            "type": "sql",
            "uri": f"sqlite:///{home / 'catalog.db'}",
            "warehouse": (home / "warehouse").as_uri(),
        },
    )
    return cat.load_table(f"thalweg.{_table(topic)}").scan(selected_fields=(RID, "n")).to_arrow()


def pg_rows(pg: PostgresServer, topic: str) -> list[tuple[Any, ...]]:
    return pg.query(f'SELECT "{RID}", "n" FROM public."{_table(topic)}"')


def sinks(pg: PostgresServer, topic: str) -> list[dict[str, Any]]:
    return [
        {"name": "lake", "kind": "iceberg", "topics": [topic], "commit_interval_s": 1.0},
        {
            "name": "db",
            "kind": "postgres",
            "topics": [topic],
            "dsn": pg.dsn,
            "commit_interval_s": 1.0,
        },
    ]


def make_topic(bootstrap: str, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(10)
    return name


class Paced:
    """Produces ``{"n": i}`` records at about ``rate`` per second until stopped."""

    def __init__(self, bootstrap: str, topic: str, rate: int, total: int | None = None) -> None:
        self.sent = 0
        self._stop = threading.Event()
        self.done = threading.Event()
        self._args = (bootstrap, topic, rate, total)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        bootstrap, topic, rate, total = self._args
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10, "log_level": 2})
        step = max(1, rate // 10)
        while not self._stop.is_set() and (total is None or self.sent < total):
            for _ in range(step if total is None else min(step, total - self.sent)):
                body = {"n": self.sent, "shard": self.sent % SHARDS}
                p.produce(topic, json.dumps(body).encode(), partition=self.sent % PARTITIONS)
                self.sent += 1
            p.poll(0)
            time.sleep(0.1)
        assert p.flush(30) == 0
        self.done.set()

    def stop(self) -> int:
        self._stop.set()
        assert self.done.wait(60)
        return self.sent


def metric(rg: RunningGateway, name: str, sink: str) -> float:
    text = urllib.request.urlopen(f"{rg.admin_url}/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(f'{name}{{sink="{sink}"}}'):
            return float(line.split()[-1])
    return float("nan")


def ready(rg: RunningGateway) -> int:
    try:
        return int(urllib.request.urlopen(f"{rg.admin_url}/ready").status)
    except urllib.error.HTTPError as exc:
        return exc.code


def assert_exactly_once(data: Path, topic: str, pg: PostgresServer, n: int) -> None:
    lane = ds.dataset(data / "decoded", format="parquet").to_table(columns=[RID, "n"])
    want = sorted(zip(lane.column(RID).to_pylist(), lane.column("n").to_pylist(), strict=True))
    assert len(want) == n and sorted(v for _, v in want) == list(range(n))
    ice = iceberg(data, topic)
    got_ice = sorted(zip(ice.column(RID).to_pylist(), ice.column("n").to_pylist(), strict=True))
    assert len(got_ice) == n and len({r for r, _ in got_ice}) == n, "iceberg: not exactly once"
    assert got_ice == want, "iceberg differs from the decoded lane"
    got_pg = sorted((bytes(r), v) for r, v in pg_rows(pg, topic))
    assert len(got_pg) == n and len({r for r, _ in got_pg}) == n, "postgres: not exactly once"
    assert got_pg == want, "postgres differs from the decoded lane"


def routed_rows(data: Path) -> list[tuple[int, int]]:
    """(shard, n) of every row in the routed sink's tables."""
    cat = iceberg_catalog(data, "shards")
    out = []
    for i in range(SHARDS):
        with contextlib.suppress(NoSuchTableError):
            t = cat.load_table(f"thalweg.shard_{i}").scan(selected_fields=("n",)).to_arrow()
            out += [(i, v) for v in t.column("n").to_pylist()]
    return out


def routed_files(data: Path) -> list[tuple[int, int]]:
    """(shard, n) of every row in the routed Arrow IPC sink's directories."""
    out = []
    for i in range(SHARDS):
        for f in sorted((data.parent / "ipc" / f"shard_{i}").glob("topic=*/partition=*/*.arrow")):
            with pa.memory_map(str(f)) as src:
                t = pa.ipc.open_file(src).read_all()
            out += [(i, v) for v in t.column("n").to_pylist()]
    return out


class Receiver(flight.FlightServerBase):  # type: ignore[misc]
    """A Flight server that keeps every ``do_put``'s ``n`` column per descriptor path."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.got: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        path = "/".join(p.decode() for p in descriptor.path)
        values = reader.read_all().column("n").to_pylist()
        with self._lock:
            self.got.setdefault(path, []).extend(values)

    def received(self) -> list[tuple[str, int]]:
        with self._lock:
            return [(path, v) for path, vs in self.got.items() for v in vs]


def routed_pg_rows(pg: PostgresServer) -> list[tuple[int, int]]:
    """(shard, n) of every row in the routed Postgres sink's tables."""
    out = []
    for i in range(SHARDS):
        with contextlib.suppress(Exception):  # a table not made yet
            out += [(i, int(n)) for (n,) in pg.query(f'SELECT "n" FROM public."pshard_{i}"')]
    return out


def test_postgres_down_20s_then_recovered_from_the_raw_lane_with_the_broker_stopped(
    gateway_factory: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    broker = TansuBroker(log_file=tmp_path / "tansu.log").start()
    pg = PostgresServer(tmp_path / "pg").init().start()
    try:
        topic = make_topic(broker.bootstrap, "phase5b")
        data = tmp_path / "lane"
        rg = gateway_factory(
            [topic],
            data_dir=data,
            sources=[source_cfg(broker.bootstrap, [topic])],
            sinks=sinks(pg, topic),
        )
        producer = Paced(broker.bootstrap, topic, rate=1500)
        wait_until(lambda: safe_count(lambda: len(pg_rows(pg, topic))) > 0, 60, "postgres rows")

        pg.stop()
        down_at = time.monotonic()
        before_ice = safe_count(lambda: iceberg(data, topic).num_rows)
        committed_before = sum(rg.committed(topic, p, 0, timeout=5) for p in range(PARTITIONS))
        statuses = []
        while time.monotonic() - down_at < 22:
            statuses.append(ready(rg))
            time.sleep(1)
        assert set(statuses) == {200}, f"/ready while postgres was down: {statuses}"
        assert rg.gateway.health.state("sink:db").value == "down"
        assert metric(rg, "twg_sink_lag_records", "db") > 0
        text = urllib.request.urlopen(f"{rg.admin_url}/metrics").read().decode()
        assert any(
            line.startswith("twg_sink_errors_total{")
            and 'sink="db"' in line
            and 'reason="unavailable"' in line
            and float(line.split()[-1]) > 0
            for line in text.splitlines()
        ), "no unavailable error counted for the postgres sink"
        # The ingest and the Iceberg sink went on.
        committed_after = sum(
            rg.committed(topic, p, committed_before // 2 + 1, timeout=10) for p in range(PARTITIONS)
        )
        assert committed_after > committed_before, "commits stopped while postgres was down"
        wait_until(
            lambda: safe_count(lambda: iceberg(data, topic).num_rows) > before_ice,
            30,
            "iceberg progress",
        )
        # The Postgres gaps are in the coverage store (read from its file on disk).
        store = CoverageStore(data, "db")
        layout = LaneLayout(data)
        gaps = sum(
            b - a
            for p in range(PARTITIONS)
            for a, b in store.gaps((topic, p, 0), scan_coverage(layout, topic, p).ranges)
        )
        assert gaps > 0, "no postgres gap recorded in the coverage store"

        n = producer.stop()
        rg.wait_durable(
            topic, {p: len(range(p, n, PARTITIONS)) for p in range(PARTITIONS)}, timeout=60
        )
        for p in range(PARTITIONS):
            rg.committed(topic, p, len(range(p, n, PARTITIONS)), timeout=30)
        broker.stop()  # nothing can be re-read from the source now
        pg.start()
        wait_until(lambda: safe_count(lambda: len(pg_rows(pg, topic))) == n, 120, "postgres parity")
        wait_until(
            lambda: safe_count(lambda: iceberg(data, topic).num_rows) == n, 60, "iceberg parity"
        )
        wait_until(lambda: metric(rg, "twg_sink_lag_records", "db") == 0, 30, "db lag 0")
        assert rg.gateway.health.state("sink:db").value == "up"
        rg.stop()
        assert_exactly_once(data, topic, pg, n)
        assert_verified(rg.gateway.cfg, broker=False)  # the broker is stopped
    finally:
        broker.stop()
        pg.stop()


def write_config(
    path: Path, bootstrap: str, topic: str, data: Path, pg: PostgresServer, receiver: str
) -> None:
    sinks = f"""
[recovery]
poll_interval_s = 0.2

[[sinks]]
name = "lake"
kind = "iceberg"
topics = ["{topic}"]
commit_interval_s = 0.5

[[sinks]]
name = "db"
kind = "postgres"
topics = ["{topic}"]
dsn = "{pg.dsn}"
commit_interval_s = 0.5

[[sinks]]
name = "shards"
kind = "iceberg"
topics = ["{topic}"]
table = "shard_{{shard}}"
commit_interval_s = 0.3

[[sinks]]
name = "dbshards"
kind = "postgres"
topics = ["{topic}"]
dsn = "{pg.dsn}"
table = "pshard_{{shard}}"
commit_interval_s = 0.3

[[sinks]]
name = "files"
kind = "arrow_ipc"
topics = ["{topic}"]
path = "{data.parent / "ipc" / "shard_{shard}"}"
commit_interval_s = 0.3

[[sinks]]
name = "downstream"
kind = "flight"
topics = ["{topic}"]
location = "{receiver}"
path = "recv/{{shard}}"
commit_interval_s = 0.3
"""
    group = f"g-{uuid.uuid4().hex[:8]}"
    path.write_text(config_text(bootstrap, topic, group, data, extra=sinks))


def test_sigkill_five_times_with_both_sinks_leaves_every_record_once_in_each(
    broker: TansuBroker, tmp_path: Path
) -> None:
    total = 60_000
    pg = PostgresServer(tmp_path / "pg").init().start()
    topic = make_topic(broker.bootstrap, "sinkcrash")
    data, config, log = tmp_path / "lane", tmp_path / "twg.toml", tmp_path / "gateway.log"
    receiver = Receiver()
    threading.Thread(target=receiver.serve, daemon=True).start()
    write_config(config, broker.bootstrap, topic, data, pg, f"grpc://127.0.0.1:{receiver.port}")
    producer = Paced(broker.bootstrap, topic, rate=6000, total=total)
    rng = seeded_rng("THALWEG_SINK_CRASH_SEED")
    proc = start_gateway(config, log)
    try:
        for _ in range(5):
            time.sleep(rng.uniform(1.5, 4.0))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            proc = start_gateway(config, log)
        assert producer.done.wait(120)

        def alive() -> None:
            assert proc.poll() is None, f"gateway exited: {log.read_text()[-2000:]}"

        wait_until(
            lambda: safe_count(lambda: len(pg_rows(pg, topic))) == total,
            180,
            "postgres",
            check=alive,
            interval=0.5,
        )
        wait_until(
            lambda: safe_count(lambda: iceberg(data, topic).num_rows) == total,
            120,
            "iceberg",
            check=alive,
            interval=0.5,
        )
        # A flush of a routed sink lands table by table (or directory by directory),
        # then its control record: a kill between them replays the flush, and each
        # table keeps its rows once.
        routed_counts: dict[str, Callable[[], int]] = {
            "routed iceberg tables": lambda: len(routed_rows(data)),
            "routed arrow ipc directories": lambda: len(routed_files(data)),
            "routed postgres tables": lambda: len(routed_pg_rows(pg)),
            "the flight receiver": lambda: len({v for _, v in receiver.received()}),
        }
        for what, count in routed_counts.items():
            wait_until(
                lambda count=count: safe_count(count) >= total,
                120,
                what,
                check=alive,
                interval=0.5,
            )
        wait_started(proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert_exactly_once(data, topic, pg, total)
        want = sorted((n % SHARDS, n) for n in range(total))
        routed = routed_rows(data)
        assert len(routed) == total, f"routed tables hold {len(routed)} rows of {total}"
        assert sorted(routed) == want
        files = routed_files(data)
        assert len(files) == total, f"routed directories hold {len(files)} rows of {total}"
        assert sorted(files) == want
        assert sorted(routed_pg_rows(pg)) == want, "routed postgres tables: not each once"
        # Flight is at-least-once: every record at its path, a replayed one maybe again.
        sent = receiver.received()
        assert {(f"recv/{n % SHARDS}", n) for n in range(total)} == set(sent)
        assert_verified(config)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        pg.stop()
        receiver.shutdown()
