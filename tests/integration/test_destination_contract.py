"""The destination contract suite: one set of behaviours, run over every destination.

As pyiceberg runs one behaviour suite over every catalog, each case here runs for each
destination in :data:`DESTINATIONS`, on the real component — a PostgreSQL server,
Iceberg on its SQL catalog over SQLite, on Glue (moto) and on a REST catalog that vends
the storage keys (``tests/iceberg_rest.py``, its warehouse on moto), Delta Lake tables
(delta-rs) on disk and on moto, Arrow IPC files, a Flight receiver — fed from a lane
written here by the sink's own feeder (what ``twg stream`` and ``twg recover`` run):

* every record lands once, a second pass writes nothing, ``twg verify`` is clean —
  under the default metadata prefix and another one — and across kill -9 of the
  feeding process mid-pass;
* rows deleted behind the gateway's back are named by ``twg verify``, and fed again by
  the running feeder (after a flush) and when the sink opens;
* a dropped destination is rebuilt from the lane by ``twg recover``;
* a value the destination refuses is set aside (``on_refused``), the rest lands;
* an upsert sink holds the fold of the topic;
* a routed sink (a table, path or directory per field value) holds each record once;
* a live table's schema changes: an added column evolves it, a widening evolves it where
  the destination can widen (else it stops the sink, as any other change does: degraded,
  the column and both types in /health and the log), and once the operator changed the
  table the sink resumes from its coverage, every record once.

Each destination declares what it supports (``Sink.capabilities``, beside its code): a
case it does not support is skipped naming that declaration. A new destination joins
by being added to :data:`DESTINATIONS` and :data:`ADAPTERS`. Crash exactness of a
whole gateway killed during ingest, per kind, is ``tests/e2e/test_sink_recovery.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner
from pyarrow import flight

from tests.helpers import (
    feeder_pass,
    kill_at,
    safe_count,
    seeded_rng,
    wait_until,
    write_segment,
)
from tests.iceberg_rest import IcebergRestCatalog
from tests.moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer
from tests.postgres_server import PostgresServer
from thalweg.cli.main import cli
from thalweg.config import parse_config
from thalweg.config.models import ThalwegConfig
from thalweg.lane import LaneLayout
from thalweg.ops.health import Health, State
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders
from thalweg.recovery.feeder import SinkFeeder
from thalweg.recovery.refused import SinkDeadLetters
from thalweg.sinks.contract import Capabilities
from thalweg.sinks.loader import load_sink_class
from thalweg.verify import Report, verify
from thalweg.verify.sinks import destination

pytestmark = pytest.mark.integration

#: Every destination: each sink kind, and the deployments of one kind whose storage or
#: catalog differ (Iceberg on Glue and on a REST catalog with vended credentials, Delta
#: on S3). A new one joins the suite here (and in ADAPTERS).
DESTINATIONS = [
    "postgres",
    "iceberg",
    "iceberg_glue",
    "iceberg_rest",
    "arrow_ipc",
    "flight",
    "delta",
    "delta_s3",
]
TOPIC = "t"
TWG = [sys.executable, "-m", "thalweg.cli.main"]
PARTITIONS = 2
SEGMENTS = [(0, 40), (40, 90), (90, 100)]  # per partition: 100 records in 3 segments


class Receiver(flight.FlightServerBase):  # type: ignore[misc]
    """A Flight endpoint that keeps every ``do_put`` table by descriptor path."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.tables: dict[str, list[pa.Table]] = {}
        self._lock = threading.Lock()

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        path = "/".join(p.decode() for p in descriptor.path)
        table = reader.read_all()
        with self._lock:
            self.tables.setdefault(path, []).append(table)
        writer.write(pa.py_buffer(b"ok"))


@dataclass
class Env:
    tmp: Path
    data: Path
    postgres: PostgresServer
    receiver: Receiver
    moto: MotoServer
    bucket: str  # a bucket of this test's own on moto
    rest: IcebergRestCatalog
    schema: str  # a Postgres schema of this test's own


@dataclass(frozen=True)
class Adapter:
    """How the suite configures, reads, damages and poisons one destination."""

    kind: str
    table: Callable[[Env, str, dict[str, Any]], dict[str, Any]]
    # What the destination holds for TOPIC: (partition, position) of each row.
    rows: Callable[[Env, ThalwegConfig, str, str], list[tuple[int, int]]]
    # A column of decoded values the destination refuses at ``bad`` positions.
    poison: Callable[[list[int], set[int]], pa.Array] | None = None
    drop: Callable[[Env, ThalwegConfig, str], None] | None = None
    delete: Callable[[Env, ThalwegConfig, str, int, int], None] | None = None
    # The operator's change of a live table: a column renamed (old, new names) ...
    rename: Callable[[Env, ThalwegConfig, str, str, str], None] | None = None
    # ... and, where the destination cannot widen a column, the table rewritten with the
    # wider types (docs/sinks.md, "Schema changes").
    rewrite: Callable[[Env, ThalwegConfig, str, dict[str, pa.DataType]], None] | None = None
    # What the table says about itself: {"description", "columns", "properties", "tags"}.
    described: Callable[[Env, ThalwegConfig, str], dict[str, Any]] | None = None
    # The key a routing template goes in: a table's name, or a path.
    route: str = "table"
    # Records per partition of the kill -9 case: fewer where each commit is a round trip
    # to a catalog and a bucket (the case is about the moments, not the volume).
    kill_records: int = 20_000


def _held_rows(env: Env, cfg: ThalwegConfig, name: str, prefix: str) -> list[tuple[int, int]]:
    cols = MetadataColumns(prefix)
    sink_cfg = next(s for s in cfg.sinks if s.name == name)
    held = destination(cfg, sink_cfg).holds([cols.partition, cols.position, cols.record_id])
    table = held.rows.get(TOPIC)
    if table is None:
        return []
    return list(
        zip(
            table.column(cols.partition).to_pylist(),
            table.column(cols.position).to_pylist(),
            strict=True,
        )
    )


def _flight_rows(env: Env, cfg: ThalwegConfig, name: str, prefix: str) -> list[tuple[int, int]]:
    cols = MetadataColumns(prefix)
    out = []
    for tables in env.receiver.tables.values():
        for t in tables:
            out += zip(
                t.column(cols.partition).to_pylist(),
                t.column(cols.position).to_pylist(),
                strict=True,
            )
    return out


def _pg_table(env: Env, name: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "postgres", "dsn": env.postgres.dsn, "schema_name": env.schema, **extra}


def _pg_drop(env: Env, cfg: ThalwegConfig, name: str) -> None:
    env.postgres.query(f'DROP TABLE "{env.schema}"."{TOPIC}"')


def _pg_delete(env: Env, cfg: ThalwegConfig, name: str, partition: int, position: int) -> None:
    cols = MetadataColumns(cfg.gateway.metadata_prefix)
    env.postgres.query(
        f'DELETE FROM "{env.schema}"."{TOPIC}" WHERE "{cols.partition}" = {partition} '
        f'AND "{cols.position}" = {position} RETURNING 1'
    )


def _ice_sink(cfg: ThalwegConfig, name: str) -> Any:
    """The sink's own view of its catalog (whichever catalog it is)."""
    return destination(cfg, next(s for s in cfg.sinks if s.name == name))


def _ice_drop(env: Env, cfg: ThalwegConfig, name: str) -> None:
    sink = _ice_sink(cfg, name)
    sink._connect().drop_table(sink.identifier(TOPIC))


def _ice_delete(env: Env, cfg: ThalwegConfig, name: str, partition: int, position: int) -> None:
    from pyiceberg.expressions import And, EqualTo

    cols = MetadataColumns(cfg.gateway.metadata_prefix)
    table = _ice_sink(cfg, name).table(TOPIC)
    table.delete(And(EqualTo(cols.partition, partition), EqualTo(cols.position, position)))


def _s3_props(env: Env) -> dict[str, Any]:
    return {"s3.endpoint": env.moto.endpoint, "s3.region": REGION}


def _glue_table(env: Env, name: str, extra: dict[str, Any]) -> dict[str, Any]:
    secret = {"s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY}
    secret |= {"glue.access-key-id": ACCESS_KEY, "glue.secret-access-key": SECRET_KEY}
    return {
        "kind": "iceberg",
        "namespace": env.schema,  # Glue's databases are the server's, not the test's
        "catalog": {
            "type": "glue",
            "warehouse": f"s3://{env.bucket}/warehouse",
            "properties": {
                **_s3_props(env),
                "glue.endpoint": env.moto.endpoint,
                "glue.region": REGION,
            },
            "secret_properties": secret,
        },
        **extra,
    }


def _rest_table(env: Env, name: str, extra: dict[str, Any]) -> dict[str, Any]:
    """A REST catalog that vends the storage keys: the sink is given none of its own."""
    return {
        "kind": "iceberg",
        "catalog": {
            "type": "rest",
            "uri": env.rest.url,
            "warehouse": env.rest.warehouse,
            "token": env.rest.token,
            "properties": _s3_props(env),
        },
        **extra,
    }


def _delta_s3_table(env: Env, name: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "delta",
        "uri": f"s3://{env.bucket}/delta",
        "storage_options": {
            "AWS_ENDPOINT_URL": env.moto.endpoint,
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ALLOW_HTTP": "true",
        },
        **extra,
    }


def _ipc_files(env: Env, name: str) -> list[Path]:
    return sorted((env.data / "sinks" / name).rglob("*.arrow"))


def _ipc_drop(env: Env, cfg: ThalwegConfig, name: str) -> None:
    shutil.rmtree(env.data / "sinks" / name / f"topic={TOPIC}")


def _ipc_delete(env: Env, cfg: ThalwegConfig, name: str, partition: int, position: int) -> None:
    cols = MetadataColumns(cfg.gateway.metadata_prefix)
    for f in _ipc_files(env, name):
        table = pa.ipc.open_file(pa.BufferReader(f.read_bytes())).read_all()  # not mapped
        keep = pc.invert(
            pc.and_(
                pc.equal(table.column(cols.partition), partition),
                pc.equal(table.column(cols.position), position),
            )
        )
        if table.filter(keep).num_rows < table.num_rows:
            with pa.OSFile(str(f), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
                w.write_table(table.filter(keep))


def _delta_table(cfg: ThalwegConfig, name: str) -> Any:
    from deltalake import DeltaTable

    sink = _ice_sink(cfg, name)
    return DeltaTable(sink.table_uri(TOPIC), storage_options=sink.storage_options())


def _delta_drop(env: Env, cfg: ThalwegConfig, name: str) -> None:
    uri = _ice_sink(cfg, name).table_uri(TOPIC)
    if not uri.startswith("s3://"):
        shutil.rmtree(uri.removeprefix("file://"))
        return
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    s3: Any = env.moto.client()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=obj["Key"])


def _delta_delete(env: Env, cfg: ThalwegConfig, name: str, partition: int, position: int) -> None:
    cols = MetadataColumns(cfg.gateway.metadata_prefix)
    where = f'"{cols.partition}" = {partition} AND "{cols.position}" = {position}'
    _delta_table(cfg, name).delete(where)


def _pg_rename(env: Env, cfg: ThalwegConfig, name: str, old: str, new: str) -> None:
    env.postgres.query(f'ALTER TABLE "{env.schema}"."{TOPIC}" RENAME COLUMN "{old}" TO "{new}"')


def _ice_rename(env: Env, cfg: ThalwegConfig, name: str, old: str, new: str) -> None:
    with _ice_sink(cfg, name).table(TOPIC).update_schema() as update:
        update.rename_column(old, new)


def _delta_rewrite(
    env: Env,
    cfg: ThalwegConfig,
    name: str,
    types: dict[str, pa.DataType] | None = None,
    renamed: dict[str, str] | None = None,
) -> None:
    """The documented rewrite of a Delta table (docs/sinks.md): read, change, overwrite."""
    from deltalake import write_deltalake

    table = _delta_table(cfg, name)
    rows = pa.table(table.to_pyarrow_table())
    for column, to in (types or {}).items():
        rows = rows.set_column(
            rows.schema.get_field_index(column), column, rows.column(column).cast(to)
        )
    rows = rows.rename_columns([(renamed or {}).get(c, c) for c in rows.column_names])
    write_deltalake(table, rows, mode="overwrite", schema_mode="overwrite")


def _delta_rename(env: Env, cfg: ThalwegConfig, name: str, old: str, new: str) -> None:
    _delta_rewrite(env, cfg, name, renamed={old: new})


def _pg_described(env: Env, cfg: ThalwegConfig, name: str) -> dict[str, Any]:
    rows = env.postgres.query(
        "SELECT a.attname, col_description(a.attrelid, a.attnum), obj_description(a.attrelid, "
        f"'pg_class') FROM pg_attribute a WHERE a.attrelid = '\"{env.schema}\".\"{TOPIC}\"'"
        "::regclass AND a.attnum > 0 AND NOT a.attisdropped"
    )
    comment = (rows[0][2] or "").splitlines() if rows else []
    props = dict(line.split("=", 1) for line in comment[1:])
    columns = {r[0]: r[1] for r in rows if r[1]}
    return {"description": comment[0] if comment else None, "columns": columns, "properties": props}


def _ice_described(env: Env, cfg: ThalwegConfig, name: str) -> dict[str, Any]:
    sink = _ice_sink(cfg, name)
    table = sink.table(TOPIC)
    out: dict[str, Any] = {
        "description": table.properties.get("comment"),
        "columns": {f.name: f.doc for f in table.schema().fields if f.doc},
        "properties": dict(table.properties),
    }
    if sink.cfg.catalog.type == "glue":  # and as the Glue table's resource tags
        glue = sink._connect().glue
        found = glue.get_table(DatabaseName=sink.cfg.namespace, Name=TOPIC)["Table"]
        arn = f"arn:aws:glue:{REGION}:{found['CatalogId']}:table/{sink.cfg.namespace}/{TOPIC}"
        out["tags"] = glue.get_tags(ResourceArn=arn)["Tags"]
    return out


def _delta_described(env: Env, cfg: ThalwegConfig, name: str) -> dict[str, Any]:
    table = _delta_table(cfg, name)
    meta = table.metadata()
    return {
        "description": meta.description,
        "columns": {
            f.name: f.metadata["comment"] for f in table.schema().fields if "comment" in f.metadata
        },
        "properties": dict(meta.configuration),
    }


def _nul_text(positions: list[int], bad: set[int]) -> pa.Array:
    return pa.array([f"a\u0000b{p}" if p in bad else f"ok{p}" for p in positions])


def _big_unsigned(positions: list[int], bad: set[int]) -> pa.Array:
    return pa.array([2**64 - 1 if p in bad else p for p in positions], pa.uint64())


ADAPTERS: dict[str, Adapter] = {
    "postgres": Adapter(
        kind="postgres",
        table=_pg_table,
        rows=_held_rows,
        poison=_nul_text,
        drop=_pg_drop,
        delete=_pg_delete,
        rename=_pg_rename,
        described=_pg_described,
    ),
    "iceberg": Adapter(
        kind="iceberg",
        table=lambda env, name, extra: {"kind": "iceberg", **extra},
        rows=_held_rows,
        poison=_big_unsigned,
        drop=_ice_drop,
        delete=_ice_delete,
        rename=_ice_rename,
        described=_ice_described,
    ),
    "iceberg_glue": Adapter(
        kind="iceberg",
        table=_glue_table,
        rows=_held_rows,
        poison=_big_unsigned,
        drop=_ice_drop,
        delete=_ice_delete,
        kill_records=6_000,
        rename=_ice_rename,
        described=_ice_described,
    ),
    "iceberg_rest": Adapter(
        kind="iceberg",
        table=_rest_table,
        rows=_held_rows,
        poison=_big_unsigned,
        drop=_ice_drop,
        delete=_ice_delete,
        kill_records=6_000,
        rename=_ice_rename,
        described=_ice_described,
    ),
    "arrow_ipc": Adapter(
        kind="arrow_ipc",
        table=lambda env, name, extra: {"kind": "arrow_ipc", **extra},
        rows=_held_rows,
        drop=_ipc_drop,
        delete=_ipc_delete,
        route="path",
    ),
    "delta": Adapter(
        kind="delta",
        table=lambda env, name, extra: {"kind": "delta", **extra},
        rows=_held_rows,
        poison=_big_unsigned,
        drop=_delta_drop,
        delete=_delta_delete,
        rename=_delta_rename,
        rewrite=_delta_rewrite,
        described=_delta_described,
    ),
    "delta_s3": Adapter(
        kind="delta",
        table=_delta_s3_table,
        rows=_held_rows,
        poison=_big_unsigned,
        drop=_delta_drop,
        delete=_delta_delete,
        kill_records=6_000,
        rename=_delta_rename,
        rewrite=_delta_rewrite,
        described=_delta_described,
    ),
    "flight": Adapter(
        kind="flight",
        table=lambda env, name, extra: {
            "kind": "flight",
            "location": f"grpc://127.0.0.1:{env.receiver.port}",
            "path": "got/{topic}",
            **extra,
        },
        rows=_flight_rows,
        route="path",
    ),
}


def test_every_destination_is_in_the_suite() -> None:
    from thalweg.sinks.loader import SINKS

    assert sorted(DESTINATIONS) == sorted(ADAPTERS)
    assert sorted(SINKS) == sorted({a.kind for a in ADAPTERS.values()})


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    try:
        yield server
    finally:
        server.shutdown()


@pytest.fixture
def env(
    tmp_path: Path, postgres: PostgresServer, receiver: Receiver, moto: MotoServer
) -> Iterator[Env]:
    bucket = moto.bucket_url("contract").removeprefix("s3://").split("/")[0]
    (tmp_path / "rest").mkdir()
    rest = IcebergRestCatalog(
        tmp_path / "rest",
        warehouse=f"s3://{bucket}/rest",
        storage={
            "s3.endpoint": moto.endpoint,
            "s3.region": REGION,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
        },
        vend=lambda: {"s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY},
        token=uuid.uuid4().hex,
    )
    schema = f"c_{uuid.uuid4().hex[:10]}"
    try:
        yield Env(
            tmp_path, tmp_path / "lane", postgres, receiver, moto, bucket, rest, schema=schema
        )
    finally:
        rest.stop()


def sink_class(dest: str) -> Any:
    """The sink class of destination ``dest``."""
    return load_sink_class(ADAPTERS[dest].kind)


def requires(dest: str, capability: str) -> None:
    """Skip, naming the declaration, a case ``dest`` does not support."""
    kind = ADAPTERS[dest].kind
    caps: Capabilities = load_sink_class(kind).capabilities
    if not getattr(caps, capability):
        pytest.skip(f"{dest}: Capabilities.{capability} is False (sinks/{kind}.py)")


def lane(
    env: Env,
    prefix: str = "_twg_",
    payload: Callable[[int, list[int]], dict[str, Any]] | None = None,
    segments: list[tuple[int, int]] = SEGMENTS,
) -> None:
    """TOPIC's PARTITIONS partitions in ``segments``, decoded as ``payload`` gives for a
    partition's positions (default ``{"n": position}``)."""
    for p in range(PARTITIONS):
        for first, end in segments:
            positions = list(range(first, end))
            columns = payload(p, positions) if payload else {"n": pa.array(positions, pa.int64())}
            write_segment(env.data, TOPIC, p, positions, first, payload=columns, prefix=prefix)


def configure(
    env: Env,
    kind: str,
    prefix: str = "_twg_",
    recovery: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
    **extra: Any,
) -> ThalwegConfig:
    """A configuration with one sink ``s`` of ``kind`` on TOPIC (its source given
    ``source`` too), and its TOML file."""
    table = {"name": "s", "topics": [TOPIC], **ADAPTERS[kind].table(env, "s", extra)}
    body = {
        "gateway": {"data_dir": str(env.data), "metadata_prefix": prefix},
        "sources": [
            {
                "name": "k",
                "kind": "kafka",
                "bootstrap_servers": "127.0.0.1:9",
                "topics": [TOPIC],
                **(source or {}),
            }
        ],
        "sinks": [table],
        **({"recovery": recovery} if recovery else {}),
    }
    (env.tmp / "twg.toml").write_text(_toml(body))
    return parse_config(body)


def _toml(body: dict[str, Any]) -> str:
    """The few shapes a configuration here has, as TOML (strings as JSON strings)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):  # an inline table; keys quoted ("s3.endpoint")
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        return json.dumps(v) if isinstance(v, str) else str(v)

    out = []
    for section, content in body.items():
        items = content if isinstance(content, list) else [content]
        for item in items:
            out.append(f"[[{section}]]" if isinstance(content, list) else f"[{section}]")
            out += [f"{k} = {value(v)}" for k, v in item.items()]
            out.append("")
    return "\n".join(out)


def verified(cfg: ThalwegConfig) -> Report:
    report = verify(cfg, broker=False, sink="s")
    assert report.ok, report.as_text()
    return report


def every_record(positions: range = range(100)) -> list[tuple[int, int]]:
    return sorted((p, o) for p in range(PARTITIONS) for o in positions)


def _n(first: int, end: int) -> dict[str, pa.Array]:
    return {"n": pa.array(range(first, end), pa.int64())}


@contextlib.contextmanager
def running_feeder(cfg: ThalwegConfig, health: Health | None = None) -> Iterator[SinkFeeder]:
    """Sink ``s``'s feeder running (``SinkFeeder.run``, as ``twg stream`` runs it) on a
    thread of its own, reporting to ``health``, stopped and joined on exit."""
    [feeder] = build_feeders(
        cfg,
        LaneLayout(cfg.gateway.data_dir),
        MetadataColumns(cfg.gateway.metadata_prefix),
        health=health,
    )
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(feeder.run(stop))
        except BaseException as exc:  # the test fails on it below
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield feeder
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
    assert not thread.is_alive() and not failed, failed


@pytest.mark.parametrize("prefix", ["_twg_", "_x_"])
@pytest.mark.parametrize("kind", DESTINATIONS)
def test_every_record_lands_once_and_a_second_pass_writes_nothing(
    env: Env, kind: str, prefix: str
) -> None:
    lane(env, prefix)
    cfg = configure(env, kind, prefix)
    first = feeder_pass(cfg, "s")
    assert (first.positions, first.lag_after) == (PARTITIONS * 100, 0)
    adapter = ADAPTERS[kind]
    assert sorted(adapter.rows(env, cfg, "s", prefix)) == every_record()
    again = feeder_pass(cfg, "s")
    assert (again.positions, again.rows) == (0, 0)
    assert sorted(adapter.rows(env, cfg, "s", prefix)) == every_record()
    report = verified(cfg)
    if sink_class(kind).capabilities.reads_back:
        assert report.sinks["s"]["records_checked"] == PARTITIONS * 100


@pytest.mark.parametrize("kind", DESTINATIONS)
def test_every_record_lands_once_across_kill_9_mid_pass(env: Env, kind: str) -> None:
    """``twg recover`` (a process, as deployed) SIGKILLed three times at random moments
    of a pass of many small flushes, then run to the end: an exactly-once destination
    holds every record once, an at-least-once one (``Sink.guarantee``) every record."""
    per, size = ADAPTERS[kind].kill_records, 1_000
    lane(env, segments=[(a, a + size) for a in range(0, per, size)])
    cfg = configure(
        env,
        kind,
        commit_rows=500,
        recovery={"window_records": 500, "max_duty": 0.25},
    )
    rows = ADAPTERS[kind].rows
    held = lambda: len(set(rows(env, cfg, "s", "_twg_")))  # noqa: E731
    total = PARTITIONS * per
    rng = seeded_rng()
    targets = sorted(rng.sample(range(total // 20, total * 3 // 4), 3))

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*TWG, "recover", "-c", str(env.tmp / "twg.toml"), "--sink", "s", "--no-check"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    kill_at(start, lambda: safe_count(held), targets, total)
    done = subprocess.run(
        [*TWG, "recover", "-c", str(env.tmp / "twg.toml"), "--sink", "s"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = rows(env, cfg, "s", "_twg_")
    want = every_record(range(per))
    if sink_class(kind).guarantee == "exactly-once":
        assert sorted(got) == want  # each once: nothing lost, nothing twice
    else:
        assert sorted(set(got)) == want  # each at least once
    verified(cfg)


@pytest.mark.parametrize("kind", DESTINATIONS)
def test_rows_deleted_behind_its_back_are_named_by_verify_and_fed_again(
    env: Env, kind: str
) -> None:
    requires(kind, "reads_back")
    lane(env)
    # Every flush is followed by the feeder's recheck (recovery.recheck_every_flushes).
    cfg = configure(
        env,
        kind,
        commit_interval_s=0.05,
        recovery={"recheck_every_flushes": 1, "poll_interval_s": 0.05},
    )
    rows = ADAPTERS[kind].rows
    delete = ADAPTERS[kind].delete
    assert delete is not None, f"{kind} reads back: the suite needs its delete"
    detects = sink_class(kind).capabilities.detects_deleted_rows
    with running_feeder(cfg) as feeder:
        wait_until(lambda: sorted(rows(env, cfg, "s", "_twg_")) == every_record(), 30, "rows")
        delete(env, cfg, "s", 1, 57)
        # Nothing new arrives, so nothing is flushed or rechecked: verify sees the hole.
        report = verify(cfg, broker=False, sink="s")
        found = {(f.code, f.where) for f in report.findings if f.level == "error"}
        assert found == {("sink_missing", f"sink s: {TOPIC}[1]")}, report.as_text()
        assert report.sinks["s"]["missing"] == 1
        if detects:
            # The live edge moves on: a flush, its recheck, and 1/57 is fed again.
            write_segment(env.data, TOPIC, 0, range(100, 110), 100, payload=_n(100, 110))
            want = sorted([*every_record(), *((0, o) for o in range(100, 110))])
            wait_until(lambda: sorted(rows(env, cfg, "s", "_twg_")) == want, 30, "57 fed again")
            assert feeder.lost_records == 1
    requires(kind, "detects_deleted_rows")
    verified(cfg)
    # And when the sink opens (a restart, twg recover): found before anything is fed.
    delete(env, cfg, "s", 0, 3)
    delete(env, cfg, "s", 0, 4)
    done = feeder_pass(cfg, "s")
    assert (done.positions, done.rows) == (2, 2)
    assert sorted(rows(env, cfg, "s", "_twg_")) == want
    verified(cfg)


@pytest.mark.parametrize("kind", DESTINATIONS)
def test_a_dropped_destination_is_rebuilt_from_the_lane_by_twg_recover(env: Env, kind: str) -> None:
    requires(kind, "rebuilds_dropped")
    lane(env)
    cfg = configure(env, kind)
    feeder_pass(cfg, "s")
    drop = ADAPTERS[kind].drop
    assert drop is not None, f"{kind} rebuilds a dropped destination: the suite needs its drop"
    drop(env, cfg, "s")
    assert ADAPTERS[kind].rows(env, cfg, "s", "_twg_") == []
    done = CliRunner().invoke(cli, ["recover", "-c", str(env.tmp / "twg.toml"), "--sink", "s"])
    assert done.exit_code == 0, done.output
    assert sorted(ADAPTERS[kind].rows(env, cfg, "s", "_twg_")) == every_record()
    verified(cfg)


@pytest.mark.parametrize("kind", DESTINATIONS)
def test_a_value_it_refuses_is_set_aside_and_the_rest_lands(env: Env, kind: str) -> None:
    requires(kind, "refuses_values")
    poison = ADAPTERS[kind].poison
    assert poison is not None, f"{kind} refuses values: the suite needs one it refuses"
    bad = {7, 41, 42}
    lane(env, payload=lambda _p, positions: {"v": poison(positions, bad)})
    cfg = configure(env, kind)
    done = feeder_pass(cfg, "s")
    assert done.lag_after == 0
    want = [(p, o) for p, o in every_record() if o not in bad]
    assert sorted(ADAPTERS[kind].rows(env, cfg, "s", "_twg_")) == want
    refused = SinkDeadLetters(LaneLayout(env.data), "s", MetadataColumns())
    for p in range(PARTITIONS):
        assert refused.held(TOPIC, p).tolist() == sorted(bad)
    report = verified(cfg)
    assert report.sinks["s"]["refused"] == PARTITIONS * len(bad)
    assert feeder_pass(cfg, "s").positions == 0  # nothing owed, nothing set aside again


@pytest.mark.parametrize("kind", DESTINATIONS)
def test_an_upsert_sink_holds_the_fold_of_the_topic(env: Env, kind: str) -> None:
    requires(kind, "upsert")
    # Seven ids per partition, each updated again and again: the newest by position wins.
    # A key's events share a partition (docs/cdc.md: the order of a key's events is its
    # partition's), so the ids of partition 1 are not those of partition 0.
    lane(
        env,
        payload=lambda p, positions: {
            "id": pa.array([p * 100 + o % 7 for o in positions], pa.int64()),
            "v": pa.array([f"v{o}" for o in positions]),
        },
    )
    cfg = configure(env, kind, mode="upsert", key=["id"])
    feeder_pass(cfg, "s")
    newest = {(p, o) for p in range(PARTITIONS) for o in range(93, 100)}
    held = ADAPTERS[kind].rows(env, cfg, "s", "_twg_")
    assert sorted(held) == sorted(newest), held  # one row per id: its newest
    assert feeder_pass(cfg, "s").rows == 0
    assert sorted(ADAPTERS[kind].rows(env, cfg, "s", "_twg_")) == sorted(newest)
    verified(cfg)
    requires(kind, "detects_deleted_rows")
    # A live key's row deleted behind its back: its newest record is fed again, and only
    # it (the fold's live keys are what the table should hold, not every record fed).
    delete = ADAPTERS[kind].delete
    assert delete is not None
    delete(env, cfg, "s", 1, 95)
    assert (1, 95) not in ADAPTERS[kind].rows(env, cfg, "s", "_twg_")
    assert (feeder_pass(cfg, "s").positions, feeder_pass(cfg, "s").positions) == (1, 0)
    assert sorted(ADAPTERS[kind].rows(env, cfg, "s", "_twg_")) == sorted(newest)
    verified(cfg)
    # And by the running feeder, after a flush (recovery.recheck_every_flushes): the
    # deleted live key's newest record fed again, while new events of other keys land.
    running = configure(
        env,
        kind,
        mode="upsert",
        key=["id"],
        commit_interval_s=0.05,
        recovery={"recheck_every_flushes": 1, "poll_interval_s": 0.05},
    )
    with running_feeder(running) as feeder:
        delete(env, running, "s", 0, 96)
        more = {"id": pa.array([50 + o for o in range(100, 105)], pa.int64())}
        more["v"] = pa.array([f"v{o}" for o in range(100, 105)])
        write_segment(env.data, TOPIC, 0, range(100, 105), 100, payload=more)
        want = sorted([*newest, *((0, o) for o in range(100, 105))])
        rows = ADAPTERS[kind].rows
        wait_until(lambda: sorted(rows(env, running, "s", "_twg_")) == want, 30, "96 fed again")
        assert feeder.lost_records == 1
    verified(running)


@pytest.mark.parametrize("kind", DESTINATIONS)
def test_a_routed_sink_holds_each_record_once_across_its_tables(env: Env, kind: str) -> None:
    requires(kind, "routing")
    shards = ["a", "b", "c"]
    lane(
        env,
        payload=lambda _p, positions: {
            "n": pa.array(positions, pa.int64()),
            "shard": pa.array([shards[o % 3] for o in positions]),
        },
    )
    template = {
        "table": "{topic}_{shard}",
        "path": str(env.tmp / "routed" / "{shard}") if kind == "arrow_ipc" else "got/{shard}",
    }[ADAPTERS[kind].route]
    cfg = configure(env, kind, **{ADAPTERS[kind].route: template})
    feeder_pass(cfg, "s")
    if kind == "flight":
        assert sorted(env.receiver.tables) == [f"got/{s}" for s in shards]
    held = ADAPTERS[kind].rows(env, cfg, "s", "_twg_")
    assert sorted(held) == every_record()
    assert feeder_pass(cfg, "s").rows == 0
    verified(cfg)


#: How each destination names the types the schema case uses (Postgres its own words;
#: the others Arrow's, as ``sinks/schema_change.py`` describes a column).
TYPE_WORDS = {
    "postgres": {"int32": "integer", "int64": "bigint", "string": "text"},
}


@pytest.mark.parametrize("kind", DESTINATIONS)
def test_a_live_tables_schema_changes_evolve_it_or_stop_the_sink_naming_the_column(
    env: Env, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    requires(kind, "evolves_schema")
    adapter = ADAPTERS[kind]
    assert adapter.rename is not None, f"{kind} evolves: the suite needs its rename"
    widens = sink_class(kind).capabilities.widens_types
    words = TYPE_WORDS.get(kind, {"int32": "int32", "int64": "int64", "string": "string"})
    recovery = {"poll_interval_s": 0.1, "degraded_retry_s": 0.3}
    cfg = configure(env, kind, recovery=recovery, commit_interval_s=0.2)
    cols = MetadataColumns()
    health = Health()

    def segment(first: int, end: int, *, wide: bool = False, tag: bool = False) -> None:
        """Positions ``first``..``end`` of both partitions: ``n`` an int32 (int64 past
        int32's range when ``wide``), ``x`` a float32 (float64 when ``wide``), ``s`` text,
        and a ``tag`` column when ``tag``."""
        for p in range(PARTITIONS):
            positions = list(range(first, end))
            payload = {
                "n": pa.array(
                    [(2**40 if wide else 0) + p * 1000 + o for o in positions],
                    pa.int64() if wide else pa.int32(),
                ),
                "x": pa.array([o + 0.1 for o in positions], pa.float64() if wide else pa.float32()),
                "s": pa.array([f"s{o}" for o in positions]),
            }
            if tag:
                payload["tag"] = pa.array([f"t{o}" for o in positions])
            write_segment(env.data, TOPIC, p, positions, first, payload=payload)

    def held(*names: str) -> pa.Table:
        found = destination(cfg, cfg.sinks[0]).holds([cols.partition, cols.position, *names])
        table = found.rows.get(TOPIC)
        return table if table is not None else pa.table({cols.position: pa.array([], pa.int64())})

    def holding(n: int) -> None:
        wait_until(
            lambda: held().num_rows == n, 60, lambda: f"{kind}: {held().num_rows} rows, not {n}"
        )

    def stopped(column: str, have: str, rows: str) -> str:
        """Wait for the sink to stop degraded; its /health detail, which names them."""
        detail = ""

        def named() -> bool:
            nonlocal detail
            entry = health.tree()["components"].get("sink:s", {})
            detail = entry.get("detail", "")
            return health.state("sink:s") is State.DEGRADED and repr(column) in detail

        wait_until(named, 60, lambda: f"{kind}: not degraded naming {column!r}: {detail}")
        assert have in detail and rows in detail, detail
        assert any(
            repr(column) in r.getMessage() and have in r.getMessage() for r in caplog.records
        )
        return detail

    def changed(p: int) -> None:
        """Positions 80..100 of partition ``p`` with ``s`` an int64, ``x`` gone."""
        positions = list(range(80, 100))
        payload = {"n": pa.array(positions, pa.int64()), "s": pa.array(positions)}
        write_segment(env.data, TOPIC, p, positions, 80, payload=payload)

    caplog.set_level("WARNING", logger="thalweg")
    segment(0, 40)
    with running_feeder(cfg, health):
        holding(80)
        segment(40, 60, tag=True)  # an added column evolves the table
        holding(120)
        assert held("tag").column("tag").drop_null().to_pylist().count("t45") == PARTITIONS
        segment(60, 80, wide=True)  # n int32 → int64, x float32 → float64
        if not widens:  # it stops, names the widening, and casts nothing down
            detail = stopped("n", words["int32"], words["int64"])
            assert "rewrite the table" in detail, detail
            time.sleep(1.0)  # several retries, each refused again
            assert held().num_rows == 120
            assert adapter.rewrite is not None
            adapter.rewrite(env, cfg, "s", {"n": pa.int64(), "x": pa.float64()})
        holding(160)
        wide = held("n", "x").filter(pc.greater_equal(pc.field(cols.position), 60))
        assert min(wide.column("n").to_pylist()) >= 2**40  # not wrapped, not cut
        assert sorted(set(wide.column("x").to_pylist())) == [o + 0.1 for o in range(60, 80)]
        changed(0)  # s text → int64: no destination takes that as it is
        stopped("s", words["string"], words["int64"])
        assert held().num_rows == 160  # the lane keeps them; the table took none
        adapter.rename(env, cfg, "s", "s", "s_text")  # the operator's change
        holding(180)
        changed(1)  # the changed table takes them as they come
        holding(200)
        wait_until(lambda: health.state("sink:s") is State.UP, 30, f"{kind}: not up again")
    final = held("s", "s_text")
    located = zip(
        final.column(cols.partition).to_pylist(),
        final.column(cols.position).to_pylist(),
        strict=True,
    )
    assert sorted(located) == every_record()
    late = final.filter(pc.greater_equal(pc.field(cols.position), 80))
    assert sorted(late.column("s").to_pylist()) == sorted(list(range(80, 100)) * PARTITIONS)
    assert final.filter(pc.less(pc.field(cols.position), 80)).column("s_text").null_count == 0
    verified(cfg)


def _contract(path: Path, city: str) -> Path:
    path.write_text(
        f"""
apiVersion: v3.0.2
kind: DataContract
id: orders-contract
version: 1.2.0
tags: [pii, "domain=sales"]
schema:
  - name: {TOPIC}
    description: Orders placed on the shop
    customProperties:
      - {{property: owner, value: team-orders}}
    properties:
      - {{name: n, logicalType: integer, description: The order number}}
      - {{name: city, logicalType: string, description: {city}}}
      - {{name: zip, logicalType: string, description: The postal code}}
"""
    )
    return path


@pytest.mark.parametrize("kind", DESTINATIONS)
def test_a_tables_description_comments_properties_and_tags_come_from_the_contract(
    env: Env, kind: str
) -> None:
    requires(kind, "describes_tables")
    described = ADAPTERS[kind].described
    assert described is not None, f"{kind} describes its tables: the suite needs a reader"

    def segment(first: int, end: int, *, zip_code: bool = False) -> None:
        for p in range(PARTITIONS):
            positions = list(range(first, end))
            payload = {
                "n": pa.array(positions, pa.int64()),
                "city": pa.array(["Oslo"] * len(positions)),
            }
            if zip_code:  # and a column only its schema describes (an Avro field's doc)
                payload["zip"] = pa.array(["0150"] * len(positions))
                payload["note"] = pa.array(["n"] * len(positions))
            table = pa.table(payload)
            if zip_code:
                i = table.schema.get_field_index("note")
                doc = {b"doc": b"Free text, from the schema"}
                table = table.cast(table.schema.set(i, table.schema.field(i).with_metadata(doc)))
            write_segment(env.data, TOPIC, p, positions, first, payload=table)

    contract = _contract(env.tmp / "orders.yaml", "Where it ships")
    cfg = configure(env, kind, source={"format": "json", "contract": str(contract)})
    segment(0, 50)
    feeder_pass(cfg, "s")
    found = described(env, cfg, "s")
    assert found["description"] == "Orders placed on the shop", found
    assert found["columns"].get("n") == "The order number", found
    assert found["columns"].get("city") == "Where it ships", found
    assert "zip" not in found["columns"]  # no such column yet
    props = found["properties"]
    assert props.get("owner") == "team-orders", props
    assert (props.get("thalweg.tag.pii"), props.get("thalweg.tag.domain")) == ("", "sales")
    assert props.get("thalweg.contract.version") == "1.2.0", props
    if "tags" in found:  # Glue: the resource tags too
        assert found["tags"] == {"pii": "", "domain": "sales"}, found["tags"]
    # The contract edited and a column added: synced again on the table's evolution.
    _contract(contract, "The city it ships to")
    segment(50, 100, zip_code=True)
    feeder_pass(cfg, "s")
    found = described(env, cfg, "s")
    assert found["columns"].get("zip") == "The postal code", found
    assert found["columns"].get("city") == "The city it ships to", found
    assert found["columns"].get("note") == "Free text, from the schema", found
    assert sorted(ADAPTERS[kind].rows(env, cfg, "s", "_twg_")) == every_record()
    verified(cfg)
