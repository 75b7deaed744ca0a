"""Helpers the tests share: waiting on a condition, producing records, reading what a
consumer group has committed, and seeds for randomised tests.

Plain functions, no fixtures (those live in ``conftest.py``): a test imports what it
uses from here rather than copying a loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pyarrow as pa
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, Producer, TopicPartition

from thalweg.embedded import free_port

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: str | Callable[[], str],
    *,
    interval: float = 0.05,
    check: Callable[[], object] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Raises AssertionError naming ``what`` (a string, or a function giving one, called
    only on failure: a log's tail, say) when ``timeout`` seconds pass first. ``check``
    runs on every round and may raise to stop the wait early (a gateway that died, a
    process that exited).
    """
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if check is not None:
            check()
        if time.monotonic() >= deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g}s waiting for {text}")
        time.sleep(interval)


def committed_offsets(
    bootstrap: str, group: str, topic: str, partitions: Iterable[int], timeout: float = 10
) -> dict[int, int]:
    """What ``group`` has committed for each partition of ``topic``, as the broker says;
    -1 for a partition with no commit (Kafka reports -1001, "invalid offset")."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 2})
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        return {tp.partition: max(tp.offset, -1) for tp in c.committed(tps, timeout=timeout)}
    finally:
        c.close()


def group_state(bootstrap: str, group: str, timeout: float = 10) -> str:
    """The broker's word on ``group``: its state and members (for a failure message: a
    group that never settles is the broker's state as much as the members')."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=timeout)[group]
        got = desc.result(timeout)
        members = ", ".join(
            f"{m.client_id}/{m.member_id[-8:]}:{len(m.assignment.topic_partitions)}"
            for m in got.members
        )
        return f"group {group}: {got.state} with {len(got.members)} members [{members}]"
    except Exception as exc:  # a diagnostic: what went wrong is the answer
        return f"group {group}: not described ({exc!r})"


def wait_committed(
    bootstrap: str, group: str, topic: str, partition: int, want: int, timeout: float = 15
) -> int:
    """The group's committed offset for one partition once it reaches ``want`` (commits
    follow durable writes asynchronously), or whatever it is when ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        got = committed_offsets(bootstrap, group, topic, [partition])[partition]
        if got >= want or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def produce_json(
    bootstrap: str,
    topic: str,
    docs: Iterable[dict[str, Any]],
    *,
    partition: int | Callable[[int], int] = 0,
    key: Callable[[int], bytes | None] | None = None,
    producer: Producer | None = None,
    flush_timeout: float = 30,
) -> int:
    """Produce each doc as one JSON record, in order; returns how many. ``partition`` is
    a number or a function of the record's index; every record is acknowledged before
    this returns."""
    p = producer or Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 2})
    n = 0
    for i, doc in enumerate(docs):
        part = partition(i) if callable(partition) else partition
        k = key(i) if key is not None else None
        p.produce(topic, json.dumps(doc).encode(), key=k, partition=part)
        if i % 2000 == 1999:
            p.poll(0)
        n += 1
    left = p.flush(flush_timeout)
    assert left == 0, f"{left} of {n} records to {topic} not acknowledged"
    return n


def produce_aio(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int | None]],
    partition: int = 0,
) -> None:
    """Produce ``(key, value, headers, timestamp_ms)`` records in order with aiokafka.

    aiokafka sends explicit timestamps as given (librdkafka turns 0 into "now"); it cannot
    send a record whose key and value are both null, which confluent-kafka can.
    """
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await p.start()
        try:
            for key, value, headers, ts in records:
                await p.send_and_wait(
                    topic,
                    value,
                    key=key,
                    partition=partition,
                    headers=headers or None,
                    timestamp_ms=ts,
                )
        finally:
            await p.stop()

    asyncio.run(run())


class ConfluentRecord(NamedTuple):
    """One record as a plain confluent-kafka consumer sees it."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int  # 0 create time, 1 log-append time
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    leader_epoch: int | None = None


def consume_confluent(
    bootstrap: str,
    topic: str,
    n: int,
    partition: int = 0,
    timeout: float = 30,
    **config: Any,
) -> list[ConfluentRecord]:
    """The first ``n`` records of one partition as a plain confluent-kafka consumer sees
    them (an assignment, no group commits); fewer when ``timeout`` passes first.
    ``config`` adds consumer settings (``fetch.max.bytes`` for large records, say)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"diff-{topic}",
            "enable.auto.commit": False,
            "log_level": 2,
            **{k.replace("_", "."): v for k, v in config.items()},
        }
    )
    c.assign([TopicPartition(topic, partition, 0)])
    out: list[ConfluentRecord] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error() is not None:
                continue
            ts_type, ts = m.timestamp()
            out.append(
                ConfluentRecord(
                    m.topic(),
                    m.partition(),
                    m.offset(),
                    ts,
                    1 if ts_type == TIMESTAMP_LOG_APPEND_TIME else 0,
                    m.key(),
                    m.value(),
                    list(m.headers() or []),
                    m.leader_epoch(),
                )
            )
    finally:
        c.close()
    return out


def produce_until_stopped(
    bootstrap: str,
    topic: str,
    partitions: int,
    stop: threading.Event,
    sent: list[int],
    *,
    per_tick: int = 200,
    tick_s: float = 0.05,
) -> None:
    """Produce ``{"n": n}`` to partition ``n % partitions``, ``per_tick`` records every
    ``tick_s``, until ``stop`` is set; then flush and append the count to ``sent``. The
    steady load of the fault tests that run a group while faults are aimed at it."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10, "log_level": 2})
    n = 0
    while not stop.is_set():
        for _ in range(per_tick):
            p.produce(topic, json.dumps({"n": n}).encode(), partition=n % partitions)
            n += 1
        p.poll(0)
        time.sleep(tick_s)
    assert p.flush(60) == 0
    sent.append(n)


def seeded_rng(name: str = "THALWEG_CRASH_SEED") -> random.Random:
    """A random generator whose seed is printed (pytest shows it with a failure), taken
    from the environment variable ``name`` when set so a failing run can be replayed."""
    seed = int(os.environ.get(name, "0")) or random.SystemRandom().randrange(1, 2**31)
    print(f"{name}={seed}  (set it to replay this run)")
    return random.Random(seed)


# Two bearer tokens for the security tests: one reads the pub-* topics only, one reads
# and writes everything.
READER = "reader-token-0123456789"
WRITER = "writer-token-0123456789"
TOKENS = [
    {"name": "analyst", "token": READER, "read": ["pub-*"]},
    {"name": "ingest", "token": WRITER, "read": ["*"], "write": ["*"]},
]


def arrow_files(directory: Path) -> pa.Table:
    """Every Arrow IPC file under ``directory`` (an ``arrow_ipc`` sink's) as one table;
    the zero-column files of spans without rows left out; an empty table when none."""
    found = sorted(directory.rglob("*.arrow"))
    tables = [pa.ipc.open_file(pa.memory_map(str(f))).read_all() for f in found]
    tables = [t for t in tables if t.num_columns]
    return pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})


def safe_count(count: Callable[[], int]) -> int:
    """``count()``, or -1 while what it counts does not exist yet (a table not created)."""
    try:
        return count()
    except Exception:
        return -1


def start_stream(
    config: Path, log: Path, level: str = "info", client_level: str | None = None
) -> subprocess.Popen[bytes]:
    """``twg stream --config config`` in its own session (stderr appended to ``log``),
    once it printed its start-up line: its signal handlers are set and Flight listens.
    ``client_level``: aiokafka's log level (``info`` logs every join of the group)."""
    client = ["--client-log-level", client_level] if client_level else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "thalweg.cli.main", "--log-level", level, *client, "stream",
         "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=open(log, "ab"),  # noqa: SIM115 (the child owns it)
        start_new_session=True,
    )  # fmt: skip
    out = proc.stdout
    assert out is not None
    line: list[bytes] = []
    reader = threading.Thread(target=lambda: line.append(out.readline()), daemon=True)
    reader.start()
    reader.join(60)
    assert line and line[0].startswith(b"thalweg"), f"gateway did not start: {line}"
    return proc


def partition_offsets(table: pa.Table) -> list[tuple[int, int]]:
    """The (partition, offset) of every row of a read that kept the locator columns."""
    return list(
        zip(
            table.column("_twg_source_partition").to_pylist(),
            table.column("_twg_source_offset").to_pylist(),
            strict=True,
        )
    )


def read_whole(url: str, topic: str, rows: int, timeout: float = 30) -> list[tuple[int, int]]:
    """A raw read of ``topic`` through the gateway at ``url`` once it returns at least
    ``rows`` records (a replica's copy of other members' partitions may lag a little)."""
    import thalweg_client

    got: list[tuple[int, int]] = []
    with thalweg_client.connect(url) as client:

        def whole() -> bool:
            got[:] = partition_offsets(client.read(topic, lane="raw"))
            return len(got) >= rows

        wait_until(whole, timeout, lambda: f"the whole of {topic} through {url} ({len(got)})")
    return got


def bucket_offsets(
    store: Any, topic: str, partitions: int, tmp: Path
) -> tuple[Counter[tuple[int, int]], list[str]]:
    """Every (partition, offset) of an object-store lane's raw objects as readers
    resolve them (the newest generation where objects overlap), and the resolved
    objects that still overlap one another (none may)."""
    import itertools

    import pyarrow.parquet as pq

    from thalweg.lane.layout import Lane, LaneLayout
    from thalweg.lane.remote.mirror import LaneMirror, resolve

    mirror = LaneMirror(LaneLayout(tmp), store)
    seen: Counter[tuple[int, int]] = Counter()
    overlapping = []
    for p in range(partitions):
        objects = resolve(mirror.objects(Lane.RAW, topic, p))
        for a, b in itertools.pairwise(objects):
            if a.last >= b.first:
                overlapping.append(f"{a.rel} / {b.rel}")
        for obj in objects:
            dest = tmp / obj.rel.replace("/", "_")
            store.get(obj.rel, dest)
            col = pq.read_table(dest, columns=["_twg_source_offset"]).column(0)
            seen.update((p, o) for o in col.to_pylist())
    return seen, overlapping


def kafka_record_fields(r: Any) -> tuple[Any, ...]:
    """(offset, timestamp, timestamp type, key, value, [(header key bytes, value)]) of a
    record as aiokafka reads it (its own record or a ``ConsumerRecord``)."""
    headers = [(k.encode() if isinstance(k, str) else k, v) for k, v in r.headers]
    return (r.offset, r.timestamp, r.timestamp_type, r.key, r.value, headers)


def kafka_column_fields(cols: Any) -> list[tuple[Any, ...]]:
    """The same tuples, row by row, from decoded ``KafkaColumns``."""
    return [
        (o, t, tt, k, v, [(h["key"], h["value"]) for h in hs])
        for o, t, tt, k, v, hs in zip(
            cols.offsets.tolist(),
            cols.timestamps.tolist(),
            cols.timestamp_types.tolist(),
            cols.keys.to_pylist(),
            cols.values.to_pylist(),
            cols.headers.to_pylist(),
            strict=True,
        )
    ]


def compiled_descriptor(proto: str, out: Path) -> bytes:
    """``proto/<proto>`` compiled to a descriptor set at ``out`` (as ``make proto``
    does), for tests that check a shipped descriptor is current."""
    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{root / 'proto'}",
            f"--descriptor_set_out={out}",
            str(root / "proto" / proto),
        ],
        check=True,
    )
    return out.read_bytes()


def kill_at(
    start: Callable[[], subprocess.Popen[bytes]],
    committed: Callable[[], int],
    targets: Sequence[int],
    total: int,
    *,
    while_running: Callable[[], None] | None = None,
) -> None:
    """Start a process and SIGKILL its group once ``committed()`` reaches each of
    ``targets`` in turn, asserting every time it had not finished (a kill mid-run);
    ``while_running`` is called once, while the first process runs."""
    for i, target in enumerate(targets):
        proc = start()
        try:
            wait_until(lambda t=target: committed() >= t, 120, f"{target} committed")  # type: ignore[misc]
            if i == 0 and while_running is not None:
                while_running()
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        assert committed() < total, "the run finished before it was killed"


def run_until(
    start: Callable[[], subprocess.Popen[bytes]], done: Callable[[], bool], what: str
) -> None:
    """Start a process, wait for ``done()``, then stop it with SIGTERM."""
    proc = start()
    try:
        wait_until(done, 120, what)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def stream_config(path: Path, data: Path, source: str, roll_rows: int) -> Path:
    """A ``twg stream`` configuration file on free loopback ports: lanes in ``data``,
    segments rolled at ``roll_rows`` (or 0.2 s), and the ``[[sources]]`` table given."""
    path.write_text(
        f"""
[gateway]
data_dir = "{data}"
flight_listen = "grpc://127.0.0.1:{free_port()}"
http_listen = "127.0.0.1:{free_port()}"
gc_tuning = false

[raw_lane]
roll_age_s = 0.2
roll_rows = {roll_rows}

[[sources]]
{source}
"""
    )
    return path


class SmallDisk:
    """A tmpfs of ``kib`` KiB mounted at ``path``: a disk that fills up, for real (the
    kernel answers ENOSPC). ``grow`` frees space the way an operator would."""

    def __init__(self, path: Path, kib: int) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:  # never skipped: .ci/run runs as root, which can mount
            raise RuntimeError(
                "a full-disk test mounts a tmpfs (run as root, or with CAP_SYS_ADMIN): "
                + proc.stderr.strip()
            )

    def grow(self, kib: int) -> None:
        subprocess.run(
            ["mount", "-o", f"remount,size={kib}k", str(self.path)], check=True, timeout=30
        )

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False, timeout=30)


def assert_verified(config: Any, *, broker: bool = True, sink: str | None = None) -> None:
    """``twg verify`` on what a fault test left (a config file or a loaded
    configuration), with ``--deep`` on a Kafka-only configuration: no finding of level
    error, and no check that could not run — a
    cluster that did not answer is a check skipped, not passed (``broker=False`` is the
    one way to leave the cluster out, said by the test). The report is the failure
    message."""
    from thalweg.config import load_config
    from thalweg.config.models import KafkaSourceConfig
    from thalweg.verify import verify

    cfg = load_config(config) if isinstance(config, Path) else config
    # Every record's content too (--deep) where the broker can be read back: a fault
    # that reshapes a record is as much a failure as one that loses it.
    deep = broker and all(isinstance(s, KafkaSourceConfig) for s in cfg.sources)
    report = verify(cfg, broker=broker, sink=sink, deep=deep)
    assert report.ok, report.as_text()
    assert not report.unchecked, f"a check did not run:\n{report.as_text()}"


def feeder_pass(cfg: Any, sink: str, **options: Any) -> Any:
    """One recovery pass of sink ``sink`` over the lanes of ``cfg``'s data_dir, as
    ``twg recover`` runs it (opened, ``pass_once(final=True, **options)``, closed): its
    ``PassSummary``."""
    import asyncio

    from thalweg.lane import LaneLayout
    from thalweg.records.columns import MetadataColumns
    from thalweg.recovery.build import build_feeders

    async def run() -> Any:
        [feeder] = build_feeders(
            cfg,
            LaneLayout(cfg.gateway.data_dir),
            MetadataColumns(cfg.gateway.metadata_prefix),
            only=sink,
        )
        try:
            await feeder.open()
            return await feeder.pass_once(final=True, **options)
        finally:
            await feeder.close()

    return asyncio.run(run())


def iceberg_table(data_dir: Path, sink: str, identifier: str) -> Any:
    """A table of the embedded Iceberg catalog of sink ``sink`` (SQLite + a local
    warehouse under ``data_dir/sinks/<sink>``), loaded now."""
    return iceberg_catalog(data_dir, sink).load_table(identifier)


def iceberg_catalog(data_dir: Path, sink: str) -> Any:
    """The embedded Iceberg catalog of sink ``sink``."""
    from pyiceberg.catalog import load_catalog

    home = (data_dir / "sinks" / sink).resolve()
    return load_catalog(
        sink,  # a SQL catalog keeps tables per catalog name: the sink's name
        **{
            "type": "sql",
            "uri": f"sqlite:///{home / 'catalog.db'}",
            "warehouse": (home / "warehouse").as_uri(),
        },
    )


class _Rec(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def write_segment(
    lane: Path,
    topic: str,
    partition: int,
    offsets: Sequence[int],
    covers_from: int,
    *,
    keys: Sequence[bytes | None] | None = None,
    xs: Sequence[str] | None = None,
    payload: Mapping[str, Any] | pa.Table | None = None,
    prefix: str = "_twg_",
) -> None:
    """One raw segment of ``offsets`` (covering from ``covers_from``: skipped offsets
    before the first) and its decoded twin ``{"x": ...}`` (``xs``, else each offset as
    text) — or the columns of ``payload`` (name → values) — written into ``lane`` as
    the gateway writes them, its metadata columns named with ``prefix``: a lane for a
    test that needs no broker."""
    from thalweg.config.models import RawLaneConfig
    from thalweg.lane import LaneLayout, SegmentWriter
    from thalweg.records import MetadataColumns, build_raw_batch

    cols = MetadataColumns(prefix)
    recs = [
        _Rec(topic, partition, o, 0, 0, keys[i] if keys else None, b"{}", ())
        for i, o in enumerate(offsets)
    ]
    raw = pa.Table.from_batches([build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=cols)])
    values = (
        {n: payload.column(n) for n in payload.column_names}
        if isinstance(payload, pa.Table)
        else dict(payload)
        if payload is not None
        else {"x": pa.array(list(xs) if xs is not None else [str(o) for o in offsets])}
    )
    decoded = pa.table(
        {
            **values,
            **{
                c: raw.column(c)
                for c in (cols.offset, cols.position, cols.partition, cols.topic, cols.record_id)
            },
            cols.decode_error: pa.nulls(len(offsets), pa.string()),
        }
    )
    if isinstance(payload, pa.Table):  # its fields as they are (a doc in their metadata)
        given = set(payload.column_names)
        schema = pa.schema(
            [payload.schema.field(f.name) if f.name in given else f for f in decoded.schema]
        )
        decoded = pa.Table.from_arrays(decoded.columns, schema=schema)
    writer = SegmentWriter(LaneLayout(lane), cols, RawLaneConfig())
    writer.write(topic, partition, raw, decoded, covers_from, offsets[-1] + 1)


def ipc_sink_config(tmp_path: Path, lane: Path, sink_path: str | None = None) -> Path:
    """A configuration file over ``lane`` (a Kafka source of topic ``t`` that is never
    asked) with an Arrow IPC sink ``files`` (at ``path = sink_path`` when given)."""
    path = f'\npath = "{sink_path}"' if sink_path else ""
    config = tmp_path / "twg.toml"
    config.write_text(
        f"""
[gateway]
data_dir = "{lane}"

[[sources]]
name = "k"
kind = "kafka"
bootstrap_servers = "127.0.0.1:9"
topics = ["t"]

[[sinks]]
name = "files"
kind = "arrow_ipc"
topics = ["t"]{path}
"""
    )
    return config


def duckdb_with(*extensions: str) -> Any:
    """DuckDB with ``extensions`` (``"iceberg"``, ``"delta"``, ``"avro"``, ``"httpfs"``)
    loaded from the files their ``duckdb-extension-<name>`` wheels install: DuckDB
    cannot download extensions here."""
    import importlib

    import duckdb

    con = duckdb.connect(
        config={"allow_unsigned_extensions": "true", "autoload_known_extensions": "false"}
    )
    for name in extensions:
        module = importlib.import_module(f"duckdb_extension_{name}")
        [ext] = Path(module.__file__ or "").parent.rglob(f"{name}.duckdb_extension")
        con.execute(f"LOAD '{ext}'")
    return con
