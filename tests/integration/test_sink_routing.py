"""One topic into many tables: a Postgres or Iceberg sink whose ``table`` names a field
of the rows (``"{tenant}_orders"``) writes each tenant's records into the tenant's table,
exactly once; past ``max_tables``, and for rows with no tenant, the records are set aside in
the sink's dead-letter lane with the reason named, the rest lands, and ``twg verify``
accounts for every record."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import assert_verified, iceberg_catalog, wait_until
from tests.integration.test_sinks import lag
from tests.postgres_server import PostgresServer

pytestmark = pytest.mark.integration

TENANTS = ["acme", "bolt", "core", "dune"]


def postgres_tables(postgres: PostgresServer, schema: str) -> dict[str, list[int]]:
    """Each tenant's table in ``schema``: its ``n`` values, sorted."""
    names = postgres.query(
        f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{schema}'"
    )
    return {
        str(t).removesuffix("_orders"): sorted(
            int(r[0]) for r in postgres.query(f'SELECT n FROM "{schema}"."{t}"')
        )
        for (t,) in names
        if t != "_thalweg_coverage"
    }


def iceberg_tables(data: Path, sink: str) -> dict[str, list[int]]:
    """Each tenant's table of the embedded catalog of ``sink``."""
    catalog = iceberg_catalog(data, sink)
    out = {}
    for ident in catalog.list_tables("thalweg"):
        if ident[-1].endswith("_orders"):
            rows = catalog.load_table(ident).scan(selected_fields=("n",)).to_arrow()
            out[ident[-1].removesuffix("_orders")] = sorted(rows["n"].to_pylist())
    return out


def ipc_tables(out: Path) -> dict[str, list[int]]:
    """Each tenant's directory under ``out``: the ``n`` of its files' rows, sorted."""
    got: dict[str, list[int]] = {}
    for f in sorted(out.glob("*_orders/topic=*/partition=*/*.arrow")):
        tenant = f.parts[len(out.parts)].removesuffix("_orders")
        with pa.memory_map(str(f)) as source:
            got.setdefault(tenant, []).extend(pa.ipc.open_file(source).read_all()["n"].to_pylist())
    return {t: sorted(v) for t, v in got.items()}


@pytest.mark.parametrize("kind", ["postgres", "iceberg", "arrow_ipc"])
def test_each_tenant_gets_its_table_and_one_past_the_ceiling_is_set_aside(
    kind: str,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    """Tables are made as tenants are first seen: three of them, each holding its
    tenant's records once; the fourth tenant's records and those with no tenant are set
    aside in the sink's dead-letter lane, the reasons named; ``twg verify`` reads every
    table the template names (Iceberg: and the control record)."""
    topic = topic_factory(2)
    sent: dict[str | None, list[int]] = {}
    for n in range(1200):
        tenant = None if n % 100 == 99 else TENANTS[n % 4]
        producer.produce(topic, json.dumps({"tenant": tenant, "n": n}).encode(), partition=n % 2)
        sent.setdefault(tenant, []).append(n)
    producer.flush(10)
    routing = {"table": "{tenant}_orders", "max_tables": 3, "commit_interval_s": 0.3}
    data = tmp_path / "lane"
    if kind == "postgres":
        postgres: PostgresServer = request.getfixturevalue("postgres")
        schema = f"s_{topic.replace('-', '_')}"
        sink = {"name": "db", "kind": kind, "dsn": postgres.dsn, "schema_name": schema}

        def tables() -> dict[str, list[int]]:
            return postgres_tables(postgres, schema)
    elif kind == "iceberg":
        sink = {"name": "db", "kind": kind}

        def tables() -> dict[str, list[int]]:
            return iceberg_tables(data, "db")
    else:  # a directory per tenant: path = "out/{tenant}_orders"
        out = tmp_path / "out"
        sink = {"name": "db", "kind": kind, "path": str(out / "{tenant}_orders")}
        routing = {k: v for k, v in routing.items() if k != "table"} | {"max_paths": 3}
        del routing["max_tables"]

        def tables() -> dict[str, list[int]]:
            return ipc_tables(out)

    rg = gateway_factory([topic], data_dir=data, sinks=[{**sink, **routing, "topics": [topic]}])
    rg.wait_durable(topic, {0: 600, 1: 600})

    def set_aside() -> list[int]:
        with thalweg_client.connect(rg.flight_url) as client:
            dead = client.read(topic, lane="dlq", sink="db")
        return sorted(json.loads(v)["n"] for v in dead["_twg_source_value"].to_pylist())

    def landed() -> bool:
        # Lag 0 is measured against the lane as a pass began: the tables are compared.
        try:
            held = tables()
            if lag(rg, "db") != 0 or len(held) != 3:
                return False
            late = next(t for t in TENANTS if t not in held)
            return all(held[t] == sent[t] for t in held) and set_aside() == sorted(
                sent[late] + sent[None]
            )
        except Exception:  # a table not made yet
            return False

    def state() -> str:
        counts = {t: len(v) for t, v in tables().items()}
        return f"tables {counts}, {len(set_aside())} set aside, lag {lag(rg, 'db')}"

    wait_until(landed, 60, lambda: f"three tenant tables and the rest set aside: {state()}")
    with thalweg_client.connect(rg.flight_url) as client:
        dead = client.read(topic, lane="dlq", sink="db")
    assert set(dead["_twg_dlq_reason"].to_pylist()) == {"sink_refused"}
    errors = dead["_twg_dlq_error"].to_pylist()
    assert any(f"{'max_paths' if kind == 'arrow_ipc' else 'max_tables'} = 3" in e for e in errors)
    assert any("no value for a field" in e for e in errors)
    assert_verified(rg.gateway.cfg)


def test_routed_upserts_fold_each_table_alone_and_verify_agrees(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    postgres: PostgresServer,
) -> None:
    """``mode = "upsert"`` with ``table = "{tenant}_orders"``: one key in several tenants
    is a row in each tenant's table (the newest of that tenant), and ``twg verify`` folds
    by table and key as the sink does — folding by key alone would call all but one of
    them extra."""
    topic = topic_factory(1)
    fold: dict[str, dict[int, int]] = {}
    for n in range(900):
        tenant, order = TENANTS[n % 3], n % 50  # each order id in every tenant
        producer.produce(topic, json.dumps({"tenant": tenant, "id": order, "n": n}).encode())
        fold.setdefault(tenant, {})[order] = n
    producer.flush(10)
    schema = f"u_{topic.replace('-', '_')}"
    sink = {
        "name": "db",
        "kind": "postgres",
        "topics": [topic],
        "dsn": postgres.dsn,
        "schema_name": schema,
        "table": "{tenant}_orders",
        "mode": "upsert",
        "key": ["id"],
        "commit_interval_s": 0.3,
    }
    rg = gateway_factory([topic], sinks=[sink])
    rg.wait_durable(topic, {0: 900})

    def tables() -> dict[str, dict[int, int]]:
        return {
            t: {
                int(i): int(n)
                for i, n in postgres.query(f'SELECT id, n FROM "{schema}"."{t}_orders"')
            }
            for t in fold
        }

    def landed() -> bool:
        try:
            return lag(rg, "db") == 0 and tables() == fold
        except Exception:  # a table not made yet
            return False

    wait_until(landed, 60, lambda: f"three tables of 50 rows each: {tables()}")
    assert_verified(rg.gateway.cfg)
