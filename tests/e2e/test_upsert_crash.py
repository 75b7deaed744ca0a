"""Upsert sinks under faults: ``twg stream`` with Debezium change events into a Postgres
and an Iceberg sink in ``mode = "upsert"`` keyed by ``id``, and a Postgres sink keyed by
the record key (no ``key``: a tombstone or a delete event removes the row), is
SIGKILLed three times while events flow, and PostgreSQL is stopped for several seconds
between two kills. Afterwards the three tables equal the fold of the topic (per key the
newest event by position, deleted keys absent) row for row, and ``twg verify`` — which
folds the lane the same way — finds nothing."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.e2e.test_crash_exactness import config_text, start_gateway, wait_started
from tests.e2e.test_sink_recovery import make_topic
from tests.helpers import assert_verified, seeded_rng, wait_until
from tests.integration.test_cdc_upsert import change_stream, fold_of, iceberg_rows, rows
from tests.postgres_server import PostgresServer
from thalweg.embedded import TansuBroker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KILLS = 3


def settled(pg: PostgresServer, data: Path, want: dict[int, dict[str, Any]]) -> bool:
    try:
        by_id = rows(pg, "public", "customers")
        return by_id == want == iceberg_rows(data) == rows(pg, "public", "by_record_key")
    except Exception:  # a table not made yet, Postgres starting
        return False


def produce(bootstrap: str, topic: str, events: list[tuple[int, bytes | None]]) -> threading.Event:
    """Send ``events`` at about 2,000 a second, each key on partition ``key % 2``."""
    done = threading.Event()

    def run() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 2})
        for i, (key, value) in enumerate(events):
            p.produce(topic, value, key=json.dumps({"id": key}).encode(), partition=key % 2)
            if i % 200 == 199:
                p.poll(0)
                time.sleep(0.1)
        assert p.flush(30) == 0
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_upsert_tables_equal_the_fold_after_kills_and_a_postgres_outage(
    broker: TansuBroker, tmp_path: Path
) -> None:
    pg = PostgresServer(tmp_path / "pg").init().start()
    topic = make_topic(broker.bootstrap, "upsertcrash")
    data, config, log = tmp_path / "lane", tmp_path / "twg.toml", tmp_path / "gateway.log"
    upsert = 'table = "customers"\nmode = "upsert"\nkey = ["id"]\ncommit_interval_s = 0.5'
    sinks = f"""envelope = "debezium"

[recovery]
poll_interval_s = 0.2

[[sinks]]
name = "lake"
kind = "iceberg"
topics = ["{topic}"]
{upsert}

[[sinks]]
name = "db"
kind = "postgres"
topics = ["{topic}"]
dsn = "{pg.dsn}"
{upsert}

[[sinks]]
name = "bykey"
kind = "postgres"
topics = ["{topic}"]
dsn = "{pg.dsn}"
table = "by_record_key"
mode = "upsert"
commit_interval_s = 0.5
"""
    group = f"g-{uuid.uuid4().hex[:8]}"
    config.write_text(config_text(broker.bootstrap, topic, group, data, extra=sinks))
    events, fold = change_stream(seed=3737, keys=1500, events=15_000)
    assert fold_of(events) == fold and fold
    done = produce(broker.bootstrap, topic, events)
    rng = seeded_rng("THALWEG_CRASH_SEED")  # printed: a failing run can be replayed
    proc = start_gateway(config, log)
    mid_stream: list[bool] = []  # whether events were still being sent at each kill
    try:
        for kill in range(KILLS):
            wait_started(proc)
            time.sleep(rng.uniform(1.0, 2.5))
            if kill == 1:  # Postgres away while events flow and the gateway writes
                pg.stop()
                time.sleep(rng.uniform(3.0, 6.0))
                pg.start()
            mid_stream.append(not done.is_set())
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            proc = start_gateway(config, log)
        assert any(mid_stream), "every kill came after the last event was sent"
        assert done.wait(60), "the producer did not finish"

        def alive() -> None:
            assert proc.poll() is None, f"gateway exited: {log.read_text()[-2000:]}"

        wait_until(
            lambda: settled(pg, data, fold),
            120,
            lambda: f"the upsert tables to equal the fold: {log.read_text()[-1500:]}",
            check=alive,
            interval=0.5,
        )
        wait_started(proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert rows(pg, "public", "customers") == fold == iceberg_rows(data)
        assert rows(pg, "public", "by_record_key") == fold
        assert_verified(config)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        pg.stop()
