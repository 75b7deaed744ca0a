"""Secondary sinks on a real broker: Iceberg (pyiceberg SQL catalog on SQLite), Postgres
(a real server) and Arrow IPC files, fed from the lanes of a running gateway.

Each ends holding every produced record exactly once, equal to the decoded lane row for
row; a second recovery pass writes nothing; an incompatible schema change degrades only
the sink it hits; the coverage each destination records itself wins over the store.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from pyiceberg.catalog import load_catalog

from tests.conftest import RunningGateway
from tests.helpers import (
    arrow_files,
    iceberg_catalog,
    produce_aio,
    produce_json,
    safe_count,
    wait_until,
)
from tests.moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer
from tests.postgres_server import PostgresServer
from thalweg.config import parse_config
from thalweg.embedded import TansuBroker
from thalweg.lane import LaneLayout
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders
from thalweg.verify import verify

pytestmark = pytest.mark.integration

RID = "_twg_record_id"


def sink_tables(data_dir: Path, pg: PostgresServer, topic: str) -> list[dict[str, Any]]:
    return [
        {"name": "lake", "kind": "iceberg", "topics": [topic], "commit_interval_s": 0.5},
        {
            "name": "db",
            "kind": "postgres",
            "topics": [topic],
            "dsn": pg.dsn,
            "schema_name": f"s_{topic.replace('-', '_')}",
            "commit_interval_s": 0.5,
        },
        {"name": "files", "kind": "arrow_ipc", "topics": [topic], "commit_interval_s": 0.5},
    ]


def iceberg_rows(data_dir: Path, topic: str) -> pa.Table:
    home = (data_dir / "sinks" / "lake").resolve()
    cat = load_catalog(
        "lake",  # a SQL catalog keeps tables per catalog name: the sink's name
        **{
            "type": "sql",
            "uri": f"sqlite:///{home / 'catalog.db'}",
            "warehouse": (home / "warehouse").as_uri(),
        },
    )
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in topic)
    return cat.load_table(f"thalweg.{name}").scan().to_arrow()


def postgres_rows(pg: PostgresServer, topic: str) -> list[tuple[object, ...]]:
    schema = f"s_{topic.replace('-', '_')}"
    table = "".join(c if c.isalnum() or c == "_" else "_" for c in topic)
    return pg.query(f'SELECT "{RID}", "n" FROM "{schema}"."{table}"')


def ipc_rows(data_dir: Path) -> pa.Table:
    return arrow_files(data_dir / "sinks" / "files")


def lag(rg: RunningGateway, sink: str) -> float:
    text = urllib.request.urlopen(f"{rg.admin_url}/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(f'twg_sink_lag_records{{sink="{sink}"}}'):
            return float(line.split()[-1])
    return float("nan")


def test_three_sinks_hold_every_record_once_and_equal_the_decoded_lane(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    postgres: PostgresServer,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=2)
    data = tmp_path / "lane"
    n = produce_json(
        broker.bootstrap,
        topic,
        ({"n": i, "name": f"r{i}"} for i in range(3000)),
        partition=lambda i: i % 2,
    )
    rg = gateway_factory([topic], data_dir=data, sinks=sink_tables(data, postgres, topic))
    rg.wait_durable(topic, {0: n // 2, 1: n // 2})
    wait_until(lambda: safe_count(lambda: len(postgres_rows(postgres, topic))) == n, 60, "postgres")
    wait_until(lambda: safe_count(lambda: iceberg_rows(data, topic).num_rows) == n, 60, "iceberg")
    wait_until(lambda: safe_count(lambda: ipc_rows(data).num_rows) == n, 60, "arrow ipc")
    for sink in ("lake", "db", "files"):
        wait_until(lambda s=sink: lag(rg, s) == 0, 30, f"sink {sink} lag metric at 0")
    rg.stop()

    lane = ds.dataset(data / "decoded", format="parquet").to_table().sort_by(RID)
    ice = iceberg_rows(data, topic).sort_by(RID)
    files = ipc_rows(data).sort_by(RID)
    pg_rows = sorted(postgres_rows(postgres, topic))
    assert lane.num_rows == n
    for got in (ice, files):
        assert got.num_rows == n and len(set(got.column(RID).to_pylist())) == n
        assert got.column(RID).to_pylist() == lane.column(RID).to_pylist()
        assert got.column("n").to_pylist() == lane.column("n").to_pylist()
    assert len(pg_rows) == n and len({r[0] for r in pg_rows}) == n
    assert sorted((bytes(r[0]), r[1]) for r in pg_rows) == sorted(
        zip(lane.column(RID).to_pylist(), lane.column("n").to_pylist(), strict=True)
    )
    # /health listed each sink without gating readiness.
    health = rg.gateway.health.tree()
    assert {"sink:lake", "sink:db", "sink:files"} <= _names(health), json.dumps(health)


def _names(tree: dict[str, Any]) -> set[str]:
    comps = tree.get("components", {})
    return set(comps) if isinstance(comps, dict) else {c["name"] for c in comps}


def test_a_second_recovery_pass_writes_nothing_and_the_destination_record_wins(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    postgres: PostgresServer,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    data = tmp_path / "lane"
    n = produce_json(broker.bootstrap, topic, ({"n": i} for i in range(1000)))
    rg = gateway_factory([topic], data_dir=data, gateway={"role": "ingest"})
    rg.wait_durable(topic, {0: n})
    cfg_dict = {
        "gateway": {"data_dir": str(data)},
        "sources": [rg.gateway.cfg.sources[0].model_dump(mode="json", exclude_none=True)],
        "sinks": sink_tables(data, postgres, topic),
    }
    rg.stop()
    cfg = parse_config(cfg_dict)
    layout, columns = LaneLayout(data), MetadataColumns(cfg.gateway.metadata_prefix)

    async def one_pass() -> dict[str, int]:
        out = {}
        for f in build_feeders(cfg, layout, columns):
            try:
                await f.open()
                out[f.sink.name] = (await f.pass_once(final=True)).rows
            finally:
                await f.close()
        return out

    assert asyncio.run(one_pass()) == {"lake": n, "db": n, "files": n}
    assert asyncio.run(one_pass()) == {"lake": 0, "db": 0, "files": 0}
    # A coverage store that lost its file: each destination's own record says what it
    # holds, so nothing is written twice.
    for f in (data / "coverage").glob("*.json"):
        f.unlink()
    assert asyncio.run(one_pass()) == {"lake": 0, "db": 0, "files": 0}
    assert iceberg_rows(data, topic).num_rows == n
    assert len(postgres_rows(postgres, topic)) == n
    assert ipc_rows(data).num_rows == n
    # Postgres's offsets table lost too: the whole topic is replayed into it, the direct
    # COPY meets the primary key, and the staged ON CONFLICT path keeps every row once.
    schema = f"s_{topic.replace('-', '_')}"
    postgres.query(f'DELETE FROM "{schema}"."_thalweg_coverage" RETURNING 1')
    for f in (data / "coverage").glob("db.json"):
        f.unlink()
    assert asyncio.run(one_pass())["db"] == n
    got = postgres_rows(postgres, topic)
    assert len(got) == n and len({r[0] for r in got}) == n
    # Every destination's rows lost while its coverage stays (a dropped table, deleted
    # files): the next pass notices and rebuilds each from the lane, never reporting
    # success over a table that is not there (``twg recover`` is this pass, once).
    table = "".join(c if c.isalnum() or c == "_" else "_" for c in topic)
    postgres.query(f'DROP TABLE "{schema}"."{table}"')
    for f in (data / "sinks" / "files").rglob("*.arrow"):
        f.unlink()
    assert asyncio.run(one_pass()) == {"lake": 0, "db": n, "files": n}
    got = postgres_rows(postgres, topic)
    assert len(got) == n and len({r[0] for r in got}) == n
    assert ipc_rows(data).num_rows == n
    assert verify(cfg).ok


def test_twg_recover_names_rows_a_table_lost_under_its_coverage_and_fails(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    postgres: PostgresServer,
    tmp_path: Path,
) -> None:
    """Rows deleted by hand from a table that is still there: the sink's recheck on open
    finds them and ``twg recover`` feeds exactly those again. With the recheck off a
    pass trusts the coverage and writes nothing, so ``twg recover`` checks the
    destination after it — exit 1, the partitions and counts named, never "ok" over
    rows that are not there. After the runbook's steps (the coverage removed) the next
    one writes them and passes."""
    topic = topic_factory(partitions=2)
    data = tmp_path / "lane"
    n = produce_json(broker.bootstrap, topic, ({"n": i} for i in range(300)))
    [db] = [t for t in sink_tables(data, postgres, topic) if t["name"] == "db"]
    rg = gateway_factory([topic], data_dir=data, sinks=[db])
    wait_until(lambda: safe_count(lambda: len(postgres_rows(postgres, topic))) == n, 60, "rows")
    rg.stop()
    schema, table = db["schema_name"], topic.replace("-", "_")
    postgres.query(f'DELETE FROM "{schema}"."{table}" WHERE "n" % 10 = 0 RETURNING 1')
    config = postgres_config(tmp_path, data, broker, topic, postgres, schema)
    fed = twg_recover(config, "db")
    assert fed.returncode == 0, fed.stdout + fed.stderr
    assert json.loads(fed.stdout)["rows"] == n // 10 and json.loads(fed.stdout)["check"] == []
    got = postgres_rows(postgres, topic)
    assert len(got) == n and len({r[0] for r in got}) == n
    postgres.query(f'DELETE FROM "{schema}"."{table}" WHERE "n" % 10 = 0 RETURNING 1')
    config = postgres_config(
        tmp_path, data, broker, topic, postgres, schema, "recheck_every_flushes = 0"
    )
    out = twg_recover(config, "db")
    assert out.returncode == 1, out.stdout + out.stderr
    summary = json.loads(out.stdout)
    assert summary["ok"] is False and summary["rows"] == 0  # the pass wrote nothing
    assert {c["code"] for c in summary["check"]} == {"sink_missing"}
    lost = [re.search(r"(\d+) covered records", c["message"]) for c in summary["check"]]
    assert sum(int(m.group(1)) for m in lost if m) == n // 10
    # The text names them too, and says what to do.
    text = subprocess.run(
        [sys.executable, "-m", "thalweg.cli.main", "recover", "-c", str(config), "--sink", "db"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert text.returncode == 1
    assert "does not hold what sink db's coverage claims" in text.stdout
    assert f"sink_missing: sink db: {topic}[" in text.stdout and "to rebuild" in text.stdout
    # --no-check trusts the coverage, as the option says.
    assert twg_recover(config, "db", "--no-check").returncode == 0
    # The runbook: the coverage removed, the next pass writes every record again (the
    # rows still there are skipped by record id) and its check passes.
    (data / "coverage" / "db.json").unlink()
    postgres.query(f'DELETE FROM "{schema}"."_thalweg_coverage" RETURNING 1')
    again = twg_recover(config, "db")
    assert again.returncode == 0, again.stdout + again.stderr
    done = json.loads(again.stdout)
    assert done["ok"] is True and done["check"] == [] and done["rows"] == n
    got = postgres_rows(postgres, topic)
    assert len(got) == n and len({r[0] for r in got}) == n


def test_twg_recover_on_iceberg_names_deleted_rows_and_a_dropped_table_is_rebuilt(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    """An Iceberg sink with dead letters in its topic passes the check; rows deleted from
    the table (its coverage kept in an older snapshot) are fed again by the recheck on
    open; with the recheck off they are named, exit 1; the runbook's step for Iceberg —
    drop the table — and the next pass rebuilds it whole, once."""
    topic = topic_factory(partitions=1)
    data = tmp_path / "lane"
    n = produce_json(broker.bootstrap, topic, ({"n": i} for i in range(200)))
    produce_aio(broker.bootstrap, topic, [(None, b"not json", [], None)] * 3)
    lake = {"name": "lake", "kind": "iceberg", "topics": [topic], "commit_interval_s": 0.5}
    rg = gateway_factory([topic], data_dir=data, sinks=[lake])
    wait_until(lambda: safe_count(lambda: iceberg_rows(data, topic).num_rows) == n, 60, "rows")
    rg.stop()
    config = cli_config(tmp_path, data, broker, topic, 'name = "lake"\nkind = "iceberg"')
    healthy = twg_recover(config, "lake")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert json.loads(healthy.stdout)["check"] == []  # the dead letters are not missing
    ident = "thalweg." + "".join(c if c.isalnum() or c == "_" else "_" for c in topic)
    catalog = iceberg_catalog(data, "lake")
    catalog.load_table(ident).delete("n < 20")
    fed = twg_recover(config, "lake")
    assert fed.returncode == 0, fed.stdout + fed.stderr
    assert json.loads(fed.stdout)["rows"] == 20 and json.loads(fed.stdout)["check"] == []
    rows = iceberg_rows(data, topic)
    assert rows.num_rows == n and len(set(rows.column(RID).to_pylist())) == n
    catalog.load_table(ident).delete("n < 20")
    config = cli_config(
        tmp_path,
        data,
        broker,
        topic,
        'name = "lake"\nkind = "iceberg"',
        "recheck_every_flushes = 0",
    )
    out = twg_recover(config, "lake")
    assert out.returncode == 1, out.stdout + out.stderr
    summary = json.loads(out.stdout)
    assert summary["rows"] == 0 and [c["code"] for c in summary["check"]] == ["sink_missing"]
    assert summary["check"][0]["message"].startswith("20 covered records")
    text = subprocess.run(
        [sys.executable, "-m", "thalweg.cli.main", "recover", "-c", str(config), "--sink", "lake"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert text.returncode == 1 and "drop the table" in text.stdout, text.stdout
    assert "control table" not in text.stdout  # an unrouted table has none
    catalog.drop_table(ident)
    again = twg_recover(config, "lake")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["rows"] == n
    rows = iceberg_rows(data, topic)
    assert rows.num_rows == n and len(set(rows.column(RID).to_pylist())) == n


def test_a_table_dropped_under_a_running_feeder_is_rebuilt_from_the_lane(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    postgres: PostgresServer,
    tmp_path: Path,
) -> None:
    """The feeder's next commit finds the table gone while its coverage claims rows:
    it reopens, the claims go, and every record is written again from the lane."""
    topic = topic_factory(partitions=1)
    data = tmp_path / "lane"
    n = produce_json(broker.bootstrap, topic, ({"n": i} for i in range(500)))
    db = [t for t in sink_tables(data, postgres, topic) if t["name"] == "db"]
    rg = gateway_factory([topic], data_dir=data, sinks=db)
    wait_until(lambda: safe_count(lambda: len(postgres_rows(postgres, topic))) == n, 60, "rows")
    schema, table = f"s_{topic.replace('-', '_')}", topic.replace("-", "_")
    postgres.query(f'DROP TABLE "{schema}"."{table}"')
    more = produce_json(broker.bootstrap, topic, ({"n": i} for i in range(n, n + 100)))
    want = n + more
    wait_until(
        lambda: safe_count(lambda: len(postgres_rows(postgres, topic))) == want,
        60,
        "the table rebuilt with every record",
    )
    rg.stop()
    got = postgres_rows(postgres, topic)
    assert len(got) == want and len({r[0] for r in got}) == want
    assert sorted(int(r[1]) for r in got) == list(range(want))


def test_an_incompatible_schema_degrades_only_that_sink(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    postgres: PostgresServer,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    data = tmp_path / "lane"
    # The lake's table already exists with "n" as a string: the rows' long cannot go in.
    home = (data / "sinks" / "lake").resolve()
    (home / "warehouse").mkdir(parents=True)
    cat = load_catalog(
        "lake",
        **{
            "type": "sql",
            "uri": f"sqlite:///{home / 'catalog.db'}",
            "warehouse": (home / "warehouse").as_uri(),
        },
    )
    cat.create_namespace("thalweg")
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in topic)
    cat.create_table(f"thalweg.{name}", schema=pa.schema([("n", pa.string())]))
    n = produce_json(broker.bootstrap, topic, ({"n": i} for i in range(500)))
    rg = gateway_factory([topic], data_dir=data, sinks=sink_tables(data, postgres, topic))
    rg.wait_durable(topic, {0: n})
    wait_until(lambda: safe_count(lambda: len(postgres_rows(postgres, topic))) == n, 60, "postgres")
    wait_until(lambda: safe_count(lambda: ipc_rows(data).num_rows) == n, 60, "arrow ipc")
    health = rg.gateway.health
    wait_until(
        lambda: (
            health.state("sink:lake") is not None and health.state("sink:lake").value == "degraded"
        ),
        30,
        "lake degraded",
    )
    assert health.state("sink:db").value == "up" and health.state("sink:files").value == "up"
    assert lag(rg, "lake") == n  # every record still owed to the lake, held in the raw lane
    assert rg.gateway.health.ready()
    assert iceberg_rows(data, topic).num_rows == 0


def test_a_recovery_role_gateway_drains_while_an_ingest_role_gateway_ingests(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=2)
    data = tmp_path / "lane"
    files = [{"name": "files", "kind": "arrow_ipc", "topics": [topic], "commit_interval_s": 0.5}]
    backfill = produce_json(
        broker.bootstrap, topic, ({"n": i} for i in range(20_000)), partition=lambda i: i % 2
    )
    ingest = gateway_factory([topic], data_dir=data, gateway={"role": "ingest"}, sinks=files)
    t0 = time.monotonic()
    ingest.wait_durable(topic, {0: backfill // 2, 1: backfill // 2})
    ingest_s = time.monotonic() - t0
    assert ingest.gateway.feeders == [] and not (data / "coverage").exists()
    recovery = gateway_factory([topic], data_dir=data, gateway={"role": "recovery"}, sinks=files)
    assert recovery.gateway.runners == []
    t1 = time.monotonic()
    more = produce_json(
        broker.bootstrap,
        topic,
        ({"n": backfill + i} for i in range(4000)),
        partition=lambda i: i % 2,
    )
    total = backfill + more
    wait_until(
        lambda: safe_count(lambda: ipc_rows(data).num_rows) == total, 120, "the backfill drained"
    )
    drain_s = time.monotonic() - t1
    ingest.wait_durable(topic, {0: total // 2, 1: total // 2})
    print(
        f"ingest role: {backfill / ingest_s:,.0f} rec/s into the lane; "
        f"recovery role: {total / drain_s:,.0f} rec/s into arrow_ipc"
    )
    rows = ipc_rows(data)
    assert sorted(rows.column("n").to_pylist()) == list(range(total))
    # One feeder per sink: a twg recover beside the recovery-role gateway is refused.
    out = twg_recover(_config_file(tmp_path, recovery), "files")
    assert out.returncode == 2 and "already fed by pid" in out.stderr, out.stderr
    recovery.stop()
    ingest.stop()
    out = twg_recover(_config_file(tmp_path, recovery), "files")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["rows"] == 0 and summary["lag_after"] == 0


def twg_recover(config: Path, sink: str, *more: str) -> subprocess.CompletedProcess[str]:
    """``twg --output json recover --config CONFIG --sink SINK [MORE]`` as a process."""
    cmd = [sys.executable, "-m", "thalweg.cli.main", "--output", "json", "recover"]
    return subprocess.run(
        [*cmd, "--config", str(config), "--sink", sink, *more],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def postgres_config(
    tmp_path: Path,
    data: Path,
    broker: TansuBroker,
    topic: str,
    pg: PostgresServer,
    schema: str,
    recovery: str = "",
) -> Path:
    """A config file (for the CLI) with a Postgres sink ``db`` of ``topic`` into
    ``schema``."""
    sink = f'name = "db"\nkind = "postgres"\ndsn = "{pg.dsn}"\nschema_name = "{schema}"'
    return cli_config(tmp_path, data, broker, topic, sink, recovery)


def cli_config(
    tmp_path: Path, data: Path, broker: TansuBroker, topic: str, sink: str, recovery: str = ""
) -> Path:
    """A config file (for the CLI) of ``data``'s lane, its Kafka source of ``topic`` and
    one sink of it (``sink``: its lines but ``topics``; ``recovery``: lines of its
    ``[recovery]`` section)."""
    path = tmp_path / "twg.toml"
    path.write_text(
        f"""
[recovery]
{recovery}

[gateway]
data_dir = "{data}"

[[sources]]
name = "k"
kind = "kafka"
bootstrap_servers = "{broker.bootstrap}"
topics = ["{topic}"]

[[sinks]]
{sink}
topics = ["{topic}"]
"""
    )
    return path


def _config_file(tmp_path: Path, rg: RunningGateway) -> Path:
    """The gateway's data_dir, source and arrow_ipc sink as a config file (for the CLI)."""
    src = rg.gateway.cfg.sources[0]
    sink = rg.gateway.cfg.sinks[0]
    path = tmp_path / "twg.toml"
    path.write_text(
        f"""
[gateway]
data_dir = "{rg.data_dir}"

[[sources]]
name = "{src.name}"
kind = "kafka"
bootstrap_servers = "{src.bootstrap_servers}"
topics = {json.dumps(src.topics)}

[[sinks]]
name = "{sink.name}"
kind = "{sink.kind}"
topics = {json.dumps(sink.topics)}
"""
    )
    return path


def test_an_iceberg_sink_on_an_s3_warehouse(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    moto: MotoServer,
    tmp_path: Path,
) -> None:
    bucket = f"lake-{uuid.uuid4().hex[:8]}"
    s3 = moto.client()
    s3.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    topic = topic_factory(partitions=1)
    data = tmp_path / "lane"
    n = produce_json(broker.bootstrap, topic, ({"n": i} for i in range(800)))
    catalog = {
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": f"s3://{bucket}/warehouse",
        "properties": {"s3.endpoint": moto.endpoint, "s3.region": REGION},
        "secret_properties": {"s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY},
    }
    sink = {"name": "s3lake", "kind": "iceberg", "topics": [topic], "commit_interval_s": 0.3}
    rg = gateway_factory([topic], data_dir=data, sinks=[{**sink, "catalog": catalog}])
    rg.wait_durable(topic, {0: n})
    props = {"type": "sql", "uri": catalog["uri"], "warehouse": catalog["warehouse"]}
    props |= catalog["properties"] | catalog["secret_properties"]  # type: ignore[operator]
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in topic)

    def rows() -> int:
        return (
            load_catalog("s3lake", **props).load_table(f"thalweg.{name}").scan().to_arrow().num_rows
        )

    wait_until(lambda: safe_count(rows) == n, 60, "rows in the S3 warehouse")
    rg.stop()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]  # type: ignore[attr-defined]
    assert any(k.endswith(".parquet") for k in keys) and any("metadata" in k for k in keys)
    assert not (data / "sinks" / "s3lake" / "warehouse").exists()  # nothing on local disk


def test_a_value_the_destination_refuses_is_set_aside_for_that_sink_alone(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    postgres: PostgresServer,
    tmp_path: Path,
) -> None:
    """Three records carry a NUL, which a Postgres ``text`` never holds. The default
    sink lands every other record, sets those three aside in its dead-letter lane (served
    over Flight, counted, accounted for by ``twg verify``) and goes on; a sink with
    ``on_refused = "stop"`` parks degraded at them; another kind of sink is untouched."""
    import pyarrow.flight as fl

    topic = topic_factory(partitions=1)
    data = tmp_path / "lane"
    bad = {137, 600, 601}
    values = [{"n": i, "s": "x\u0000y" if i in bad else f"ok{i}"} for i in range(1000)]
    n = produce_json(broker.bootstrap, topic, iter(values))
    tables = sink_tables(data, postgres, topic)
    db = next(t for t in tables if t["name"] == "db")
    stuck = {**db, "name": "stuck", "schema_name": f"t_{topic.replace('-', '_')}"}
    stuck["on_refused"] = "stop"
    files = next(t for t in tables if t["name"] == "files")
    rg = gateway_factory([topic], data_dir=data, sinks=[db, stuck, files])
    rg.wait_durable(topic, {0: n})
    want = n - len(bad)
    wait_until(lambda: safe_count(lambda: len(postgres_rows(postgres, topic))) == want, 60, "db")
    wait_until(lambda: safe_count(lambda: ipc_rows(data).num_rows) == n, 60, "arrow ipc")
    wait_until(lambda: lag(rg, "db") == 0, 30, "db's lag at 0: the refused records covered")
    health = rg.gateway.health
    wait_until(
        lambda: getattr(health.state("sink:stuck"), "value", "") == "degraded", 30, "stuck parked"
    )
    assert lag(rg, "stuck") > 0
    assert health.state("sink:db").value == "up"
    metrics = urllib.request.urlopen(f"{rg.admin_url}/metrics").read().decode()
    assert 'twg_sink_dead_letters_total{sink="db"} 3.0' in metrics, metrics

    client = fl.connect(rg.flight_url)
    ticket = {"topic": topic, "lane": "dlq", "sink": "db", "end": "now"}
    refused = client.do_get(fl.Ticket(json.dumps(ticket).encode())).read_all()
    assert refused.column("_twg_source_offset").to_pylist() == sorted(bad)
    assert set(refused.column("_twg_dlq_reason").to_pylist()) == {"sink_refused"}
    assert set(refused.column("_twg_dlq_stage").to_pylist()) == {"sink:db"}
    assert all("0x00" in e for e in refused.column("_twg_dlq_error").to_pylist()), refused
    assert [json.loads(v) for v in refused.column("_twg_source_value").to_pylist()] == [
        values[i] for i in sorted(bad)
    ]
    # The topic's own dead letters (decode failures) are another lane: none here.
    plain = {"topic": topic, "lane": "dlq", "end": "now"}
    assert client.do_get(fl.Ticket(json.dumps(plain).encode())).read_all().num_rows == 0
    # A sink name with a typo is refused by name, never read as a sink that refused
    # nothing.
    typo = {**ticket, "sink": "dbb"}
    with pytest.raises(pa.ArrowInvalid, match=r"no sink .dbb. .*: db, files, stuck"):
        client.do_get(fl.Ticket(json.dumps(typo).encode())).read_all()
    rg.stop()

    got = sorted(int(r[1]) for r in postgres_rows(postgres, topic))
    assert got == [i for i in range(n) if i not in bad]
    cfg = rg.gateway.cfg
    report = verify(cfg, sink="db")
    assert report.ok, report.as_text()
    assert report.sinks["db"]["refused"] == len(bad)
    # A replay over the same positions (a recovery pass after the coverage was lost)
    # finds the same refusals and adds nothing to the dead-letter lane.
    (data / "coverage" / "db.json").unlink()
    postgres.query(f'DELETE FROM "{db["schema_name"]}"._thalweg_coverage')
    config = postgres_config(tmp_path, data, broker, topic, postgres, db["schema_name"])
    done = twg_recover(config, "db")
    assert done.returncode == 0, done.stderr
    again = verify(cfg, sink="db")
    assert again.ok, again.as_text()
    assert again.sinks["db"]["refused"] == len(bad)
    assert sorted(int(r[1]) for r in postgres_rows(postgres, topic)) == got
