"""Postgres and Iceberg sinks in ``mode = "upsert"`` fed Debezium change events: each
table equals the fold of the topic (per key the newest event by lane position, deleted
keys absent), and a recovery pass over positions already landed changes nothing."""

from __future__ import annotations

import json
import random
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flight_sql
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import assert_verified, feeder_pass, iceberg_table, wait_until
from tests.integration.test_sinks import lag
from tests.postgres_server import PostgresServer
from thalweg.config import parse_config
from thalweg.verify import verify

pytestmark = pytest.mark.integration

KEYS = 600
EVENTS = 3000
PARTITIONS = 2


def change_stream(
    seed: int, keys: int = KEYS, events: int = EVENTS
) -> tuple[list[tuple[int, bytes | None]], dict[int, dict[str, Any]]]:
    """``events`` Debezium events over ``keys`` keys — creates, updates, deletes (each
    followed by its tombstone), keys deleted and created again — and their fold."""
    rng = random.Random(seed)
    table: dict[int, dict[str, Any]] = {}
    out: list[tuple[int, bytes | None]] = []
    while len(out) < events:
        key = rng.randrange(keys)
        row = table.get(key)
        version = rng.randrange(1_000_000)
        if row is None:
            after = {"id": key, "email": f"{key}@x", "version": version}
            event = {"before": None, "after": after, "op": "c"}
            table[key] = after
        elif rng.random() < 0.25:
            event = {"before": row, "after": None, "op": "d"}
            del table[key]
        else:
            after = {**row, "version": version}
            event = {"before": row, "after": after, "op": "u"}
            table[key] = after
        event["source"] = {"connector": "postgresql", "lsn": len(out)}
        out.append((key, json.dumps(event).encode()))
        if event["op"] == "d" and key % 2:
            # The tombstone Debezium sends after a delete (unless tombstones.on.delete
            # is off: half the keys go without, so a delete event alone must delete).
            out.append((key, None))
    return out, table


def fold_of(events: list[tuple[int, bytes | None]]) -> dict[int, dict[str, Any]]:
    """The table the events describe: per key the last event's row, deleted keys absent."""
    table: dict[int, dict[str, Any]] = {}
    for key, value in events:
        if value is None:
            continue  # a tombstone: its delete event came just before it
        event = json.loads(value)
        if event["op"] == "d":
            table.pop(key, None)
        else:
            table[key] = event["after"]
    return table


def rows(pg: PostgresServer, schema: str, table: str) -> dict[int, dict[str, Any]]:
    got = pg.query(f'SELECT "id", "email", "version" FROM "{schema}"."{table}"')
    return {int(i): {"id": int(i), "email": e, "version": int(v)} for i, e, v in got}


def upsert_sinks(
    postgres: PostgresServer, topic: str, prefix: str, **opts: Any
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The schema, and a Postgres (``db``) and an Iceberg (``lake``) sink in ``mode =
    "upsert"`` writing table ``customers`` of ``topic``, with ``opts`` (e.g. ``key``)."""
    schema = f"{prefix}_{topic.replace('-', '_')}"
    common = {"topics": [topic], "table": "customers", "mode": "upsert", **opts}
    common["commit_interval_s"] = 0.3
    db = {"name": "db", "kind": "postgres", "dsn": postgres.dsn, "schema_name": schema}
    return schema, {**db, **common}, {"name": "lake", "kind": "iceberg", **common}


def iceberg_rows(data_dir: Path) -> dict[int, dict[str, Any]]:
    table = iceberg_table(data_dir, "lake", "thalweg.customers").scan().to_arrow()
    got = table.select(["id", "email", "version"]).to_pylist()
    assert len(got) == len({r["id"] for r in got}), "a key twice in the Iceberg table"
    return {int(r["id"]): r for r in got}


def test_an_upsert_table_equals_the_fold_of_the_change_stream(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    postgres: PostgresServer,
    tmp_path: Path,
) -> None:
    topic = topic_factory(PARTITIONS)
    events, fold = change_stream(seed=37)
    assert fold_of(events) == fold
    schema, sink, lake = upsert_sinks(postgres, topic, "s", key=["id"])
    data = tmp_path / "lane"
    rg = gateway_factory([topic], data_dir=data, envelope="debezium", sinks=[sink, lake])
    health = f"{rg.admin_url}/health"
    # In three waves, each landed before the next is sent: the later waves update and
    # delete rows the tables already hold from earlier flushes.
    for wave in (1, 2, 3):
        sent = events[: len(events) * wave // 3]
        for key, value in events[len(events) * (wave - 1) // 3 : len(sent)]:
            producer.produce(topic, value, key=json.dumps({"id": key}).encode(), partition=key % 2)
        producer.flush(10)
        rg.wait_durable(topic, {p: sum(1 for k, _ in sent if k % 2 == p) for p in (0, 1)})
        want = fold_of(sent)

        def caught_up(want: dict[int, dict[str, Any]] = want) -> bool:
            # Lag 0 is measured against the lane as a pass began, which may predate the
            # wave's last segment: the tables themselves are compared until both hold it.
            try:
                done = lag(rg, "db") == 0 and lag(rg, "lake") == 0
                return done and rows(postgres, schema, "customers") == want == iceberg_rows(data)
            except Exception:  # the tables are made by the first flushes
                return False

        wait_until(
            caught_up, 60, lambda w=wave: f"wave {w}: {urllib.request.urlopen(health).read()}"
        )
    assert fold, "the stream deleted every key: nothing to compare"
    # The latest view over do_get folds the lane the same way (keyed by the record key).
    for encoding in ("json", "protobuf"):
        with thalweg_client.connect(rg.flight_url, ticket_encoding=encoding) as client:
            view = client.read(topic, view="latest", metadata="none")
        got = view.select(["id", "email", "version"]).to_pylist()
        assert len(got) == len(fold) and {r["id"]: r for r in got} == fold, encoding
        assert not any(view["__deleted"].to_pylist())
        # Asking for some columns only: the fold still sees the deletes.
        with thalweg_client.connect(rg.flight_url, ticket_encoding=encoding) as client:
            some = client.read(topic, view="latest", columns=["id", "version"], metadata="none")
        assert some.column_names == ["id", "version"], encoding
        assert {r["id"]: r["version"] for r in some.to_pylist()} == {
            k: v["version"] for k, v in fold.items()
        }
    # And the Flight SQL schema "latest": the same fold, deleted keys absent.
    with flight_sql.connect(rg.flight_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT id, email, version FROM latest."{topic}"')
        table = cur.fetch_arrow_table()
    assert {r["id"]: r for r in table.to_pylist()} == fold and table.num_rows == len(fold)
    rg.stop()

    # A recovery pass over every position again (the coverage rows forgotten): the
    # rows land once more in lane order, and the table stays the fold.
    postgres.query(f'DELETE FROM "{schema}"."_thalweg_coverage" RETURNING 1')
    cfg = parse_config(
        {
            "gateway": {"data_dir": str(data)},
            "sources": [
                {
                    "name": "s",
                    "kind": "kafka",
                    "bootstrap_servers": "127.0.0.1:1",
                    "topics": [topic],
                    "envelope": "debezium",
                },
            ],
            "sinks": [sink, lake],
        }
    )

    assert feeder_pass(cfg, "db", topic=topic).rows > 0  # it did write again
    assert rows(postgres, schema, "customers") == fold
    # twg verify folds the lane the same way: each key's newest row, no deletes.
    assert_verified(cfg, broker=False)
    postgres.query(f"""DELETE FROM "{schema}"."customers" WHERE "id" = {min(fold)} RETURNING 1""")
    report = verify(cfg, broker=False, sink="db")
    assert not report.ok and "sink_missing" in report.as_text()


def changelog(seed: int, keys: int = 300, events: int = 1500) -> list[tuple[bytes, bytes | None]]:
    """A compacted topic's records: a value is the key's row now, a null value (a
    tombstone) deletes it; keys deleted and written again."""
    rng = random.Random(seed)
    out: list[tuple[bytes, bytes | None]] = []
    for n in range(events):
        key = f"customer-{rng.randrange(keys)}".encode()
        value = None if rng.random() < 0.2 else json.dumps({"n": n, "tier": rng.randrange(5)})
        out.append((key, None if value is None else value.encode()))
    return out


@pytest.mark.parametrize("prefix", ["_twg_", "meta_"])
def test_a_plain_keyed_changelog_folds_by_the_record_key(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    postgres: PostgresServer,
    tmp_path: Path,
    prefix: str,
) -> None:
    """No envelope and no ``key``: the record key names the row, a null value deletes
    it — in Postgres, in Iceberg and in ``twg verify``; under the default metadata
    prefix and another (the sinks name the key, value and position columns by it)."""
    key_col = f"{prefix}source_key"
    topic = topic_factory(PARTITIONS)
    events = changelog(seed=7)
    fold: dict[bytes, int] = {}
    for key, value in events:
        if value is None:
            fold.pop(key, None)
        else:
            fold[key] = json.loads(value)["n"]
    schema, sink, lake = upsert_sinks(postgres, topic, "c")
    data = tmp_path / "lane"
    rg = gateway_factory(
        [topic], data_dir=data, sinks=[sink, lake], gateway={"metadata_prefix": prefix}
    )
    parts = {0: 0, 1: 0}
    for key, value in events:
        p = sum(key) % PARTITIONS  # a key stays in one partition
        producer.produce(topic, value, key=key, partition=p)
        parts[p] += 1
    producer.flush(10)
    rg.wait_durable(topic, parts)

    def tables() -> tuple[dict[bytes, int], dict[bytes, int]]:
        got = postgres.query(f'SELECT "{key_col}", "n" FROM "{schema}"."customers"')
        db = {bytes(k): int(n) for k, n in got}
        ice = iceberg_table(data, "lake", "thalweg.customers").scan().to_arrow()
        assert ice.num_rows == len(set(ice[key_col].to_pylist())), "a key twice"
        return db, dict(zip(ice[key_col].to_pylist(), ice["n"].to_pylist(), strict=True))

    def caught_up() -> bool:
        try:
            return lag(rg, "db") == 0 and lag(rg, "lake") == 0 and tables() == (fold, fold)
        except Exception:  # the tables are made by the first flushes
            return False

    wait_until(caught_up, 60, lambda: f"tables {[len(t) for t in tables()]} of {len(fold)}")
    cols = [
        r[0]
        for r in postgres.query(
            "SELECT column_name FROM information_schema.columns "
            f"WHERE table_schema = '{schema}' AND table_name = 'customers'"
        )
    ]
    assert f"{prefix}source_value" not in cols, "the value's bytes kept though not asked for"
    assert f"{prefix}position" in cols and f"{prefix}record_id" in cols
    rg.stop()
    assert_verified(rg.gateway.cfg, broker=False)
    # verify folds by the record key too: a kept key's row removed is found missing.
    postgres.query(
        f"""DELETE FROM "{schema}"."customers" WHERE "{key_col}" = '\\x{min(fold).hex()}'"""
        " RETURNING 1"
    )
    report = verify(rg.gateway.cfg, broker=False, sink="db")
    assert not report.ok and "sink_missing" in report.as_text()


def test_hostile_change_events_are_set_aside_and_the_table_stays_the_fold(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    postgres: PostgresServer,
) -> None:
    """An envelope without ``op`` (decode dead letter), an update whose image has no key
    (the sink sets it aside, named), a key of another type: each is accounted for,
    the rest is the fold, and ``twg verify`` agrees."""
    topic = topic_factory(1)

    def event(op: str, after: dict[str, Any] | None, before: Any = None) -> bytes:
        return json.dumps({"before": before, "after": after, "op": op}).encode()

    good = [event("c", {"id": i, "email": f"{i}@x", "version": 1}) for i in range(5)]
    hostile = [
        json.dumps({"after": {"id": 9, "email": "no-op", "version": 1}}).encode(),
        event("u", {"email": "1@y", "version": 2}, before={"id": 1}),  # no key in the image
        event("c", {"id": {"nested": 1}, "email": "typed", "version": 1}),  # another type
    ]
    tail = [event("u", {"id": 2, "email": "2@y", "version": 3}), event("d", None, {"id": 3})]
    for value in good + hostile + tail:
        producer.produce(topic, value, partition=0)
    producer.flush(10)
    schema, sink, _ = upsert_sinks(postgres, topic, "h", key=["id"])
    rg = gateway_factory([topic], envelope="debezium", sinks=[sink])
    rg.wait_durable(topic, {0: 10})
    want = {i: {"id": i, "email": f"{i}@x", "version": 1} for i in (0, 1, 4)}
    want[2] = {"id": 2, "email": "2@y", "version": 3}

    def landed() -> bool:
        try:
            return lag(rg, "db") == 0 and rows(postgres, schema, "customers") == want
        except Exception:  # the table is made by the first flush
            return False

    wait_until(landed, 60, lambda: f"the fold of the good events: {want}")
    with thalweg_client.connect(rg.flight_url) as client:
        decode = client.read(topic, lane="dlq")
        refused = client.read(topic, lane="dlq", sink="db")
    assert sorted(decode["_twg_dlq_reason"].to_pylist()) == ["envelope", "type_conflict"]
    assert refused["_twg_dlq_reason"].to_pylist() == ["sink_refused"]
    assert "no value for the key column(s) ['id']" in refused["_twg_dlq_error"][0].as_py()
    assert refused["_twg_source_value"].to_pylist() == [hostile[1]]
    rg.stop()
    assert_verified(rg.gateway.cfg, broker=False)
