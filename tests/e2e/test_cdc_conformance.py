"""The change-stream conformance kit: the events peers' upsert sinks break on, sent
through ``twg stream`` (a real process, SIGKILLed once) into every upsert destination —
Postgres, Iceberg and Delta — and read back from the latest view. Each equals the fold
of the events afterwards, and ``twg verify`` finds nothing.

The events: a key that changes (a delete of the old key, a create of the new); updates
whose ``after`` carries Debezium's unavailable-value placeholder as text, as bytea
(base64 in JSON) and as a one-element array — the key's current value is kept and the
placeholder never lands, whether that value is in the same flush or in the table; a key
never seen whose update lacks a value (null, named in ``__unavailable``); a table whose
every column is in the key; a delete then a create of one key inside one flush; a
tombstone with no delete before it (the record-keyed latest view deletes the key; a
sink keyed by columns cannot read the record key, so its row stays — the documented
choice, docs/cdc.md); a truncate (a dead letter, reason ``envelope``: it names no row);
one key's events over two flushes with a SIGKILL between their commits.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.e2e.test_crash_exactness import config_text, start_gateway, wait_started
from tests.e2e.test_sink_recovery import make_topic
from tests.helpers import assert_verified, iceberg_table, wait_until
from tests.postgres_server import PostgresServer
from thalweg.embedded import TansuBroker, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PH = "__debezium_unavailable_value"
PH64 = base64.b64encode(PH.encode()).decode()
DESTINATIONS = ("postgres", "iceberg", "delta")  # every upsert destination
Event = tuple[dict[str, Any], dict[str, Any] | None]  # record key, Debezium event


def ev(op: str, before: Any = None, after: Any = None) -> dict[str, Any]:
    return {"before": before, "after": after, "op": op, "source": {"lsn": 1}, "ts_ms": 1}


def row(i: int, email: str, bio: Any = "long", pic: Any = "AAE=", tags: Any = ("t",)) -> Any:
    return {"id": i, "email": email, "bio": bio, "pic": pic, "tags": list(tags)}


def customers(phase: int) -> list[Event]:
    """Each phase's events of the ``customers`` topic (keyed ``{"id": n}``)."""
    k = lambda i: {"id": i}  # noqa: E731
    if phase == 1:
        return [
            (k(1), ev("c", after=row(1, "a@x", "bio-1", "AAE=", ["t1"]))),
            (k(2), ev("c", after=row(2, "b@x"))),
            (k(3), ev("c", after=row(3, "c@x"))),
            (k(5), ev("c", after=row(5, "e@x"))),
            (k(6), ev("c", after=row(6, "f@x"))),
            (k(9), ev("c", after=row(9, "i@x", "bio-9"))),
        ]
    if phase == 2:
        return [
            # Placeholders in every form, the value in the table (an earlier flush).
            (k(1), ev("u", after=row(1, "a2@x", PH, PH64, [PH]))),
            # Twice in one flush: the first fills from the table, the second from it.
            (k(2), ev("u", after=row(2, "b2@x", PH))),
            (k(2), ev("u", after=row(2, "b3@x", PH, PH64))),
            # The key changes: 3 becomes 4.
            (k(3), ev("d", before=row(3, "c@x"))),
            (k(3), None),
            (k(4), ev("c", after=row(4, "c@x"))),
            # Delete then create of one key inside one flush.
            (k(5), ev("d", before=row(5, "e@x"))),
            (k(5), ev("c", after=row(5, "e2@x", "bio-5b"))),
            # A tombstone with no delete before it.
            (k(6), None),
            # Created and updated with a placeholder in one flush.
            (k(7), ev("c", after=row(7, "g@x", "bio-7"))),
            (k(7), ev("u", after=row(7, "g2@x", PH))),
            # A key never seen (the snapshot missed it): its bio is not known.
            (k(8), ev("u", after=row(8, "h@x", PH))),
            ({"id": 0}, ev("t")),  # a truncate
            (k(9), ev("u", after=row(9, "i2@x", "bio-9b"))),
        ]
    # Phase 3, after a SIGKILL: key 9's next events, one with a placeholder.
    return [
        (k(9), ev("u", after=row(9, "i3@x", PH))),
        (k(8), ev("u", after=row(8, "h2@x", PH))),  # still not known
        (k(1), ev("d", before=row(1, "a2@x"))),
    ]


def memberships(phase: int) -> list[Event]:
    """A table whose every column is in the key (``user_id``, ``group_id``)."""
    k = lambda u, g: {"user_id": u, "group_id": g}  # noqa: E731
    if phase == 1:
        return [(k(1, 1), ev("c", after=k(1, 1))), (k(1, 2), ev("c", after=k(1, 2)))]
    if phase == 2:
        return [
            (k(1, 1), ev("d", before=k(1, 1))),
            (k(2, 1), ev("c", after=k(2, 1))),
            (k(2, 1), ev("d", before=k(2, 1))),
            (k(2, 1), ev("c", after=k(2, 1))),
        ]
    return [(k(1, 1), ev("c", after=k(1, 1))), (k(1, 2), ev("d", before=k(1, 2)))]


def fold(events: list[Event], *, by_record_key: bool) -> dict[Any, dict[str, Any]]:
    """The table the events describe, with the placeholder's rule: a column the event
    did not carry keeps the key's current value, and is null and named in
    ``__unavailable`` where the key had none. A lone tombstone deletes only when the
    table is keyed by the record key."""
    table: dict[Any, dict[str, Any]] = {}
    for key, event in events:
        name = json.dumps(key, sort_keys=True)
        if event is None:
            if by_record_key:
                table.pop(name, None)
            continue
        if event["op"] == "t":
            continue
        if event["op"] == "d":
            table.pop(name, None)
            continue
        now, was = dict(event["after"]), table.get(name)
        missing = []
        for c, v in event["after"].items():
            if v in (PH, PH64, [PH]):
                known = was is not None and c not in (was["__unavailable"] or [])
                now[c] = was[c] if known and was is not None else None
                if not known:
                    missing.append(c)
        now["__unavailable"] = sorted(missing) or None
        table[name] = now
    return table


def by_key(rows: list[dict[str, Any]], key: list[str]) -> dict[Any, dict[str, Any]]:
    out = {}
    for r in rows:
        if isinstance(r.get("tags"), str):  # Postgres holds arrays as JSON text
            r["tags"] = json.loads(r["tags"])
        if isinstance(r.get("__unavailable"), str):
            r["__unavailable"] = json.loads(r["__unavailable"])
        if r.get("__unavailable") is not None:
            r["__unavailable"] = sorted(r["__unavailable"])
        out[json.dumps({k: r[k] for k in key}, sort_keys=True)] = r
    assert len(out) == len(rows), "a key twice"
    return out


C_COLS = ["id", "email", "bio", "pic", "tags", "__unavailable"]
M_COLS = ["user_id", "group_id"]


def held(dest: str, table: str, cols: list[str], pg: PostgresServer, data: Path) -> list[Any]:
    """The destination's rows, ``cols`` each (a column it does not have yet: null)."""
    if dest == "postgres":
        got = pg.query(f"SELECT to_jsonb(t) FROM public.{table} t")
        rows = [r[0] if isinstance(r[0], dict) else json.loads(r[0]) for r in got]
    elif dest == "iceberg":
        rows = iceberg_table(data, f"ice_{table}", f"thalweg.{table}").scan().to_arrow().to_pylist()
    else:
        from deltalake import DeltaTable

        uri = data / "sinks" / f"delta_{table}" / table
        rows = DeltaTable(str(uri)).to_pyarrow_table().to_pylist()
    return [{c: r.get(c) for c in cols} for r in rows]


def sinks_toml(pg: PostgresServer, c_topic: str, m_topic: str) -> str:
    out = ['envelope = "debezium"\n\n[recovery]\npoll_interval_s = 0.2\n']
    tables = (("customers", c_topic, '["id"]'), ("memberships", m_topic, '["user_id", "group_id"]'))
    for table, topic, key in tables:
        for dest, prefix in (("postgres", "pg"), ("iceberg", "ice"), ("delta", "delta")):
            extra = f'dsn = "{pg.dsn}"\n' if dest == "postgres" else ""
            out.append(
                f'[[sinks]]\nname = "{prefix}_{table}"\nkind = "{dest}"\ntopics = ["{topic}"]\n'
                f'table = "{table}"\nmode = "upsert"\nkey = {key}\ncommit_interval_s = 0.3\n'
                f"{extra}"
            )
    return "\n".join(out)


def test_every_upsert_destination_and_the_latest_view_equal_the_fold(
    broker: TansuBroker, tmp_path: Path
) -> None:
    pg = PostgresServer(tmp_path / "pg").init().start()
    c_topic = make_topic(broker.bootstrap, "conform-c")
    m_topic = make_topic(broker.bootstrap, "conform-m")
    data, config, log = tmp_path / "lane", tmp_path / "twg.toml", tmp_path / "gateway.log"
    group = f"g-{uuid.uuid4().hex[:8]}"
    text = config_text(
        broker.bootstrap, c_topic, group, data, extra=sinks_toml(pg, c_topic, m_topic)
    )
    text = text.replace(
        f'topics = ["{c_topic}"]\ngroup_id', f'topics = ["{c_topic}", "{m_topic}"]\ngroup_id', 1
    )
    flight = free_port()
    text = text.replace('"grpc://127.0.0.1:0"', f'"grpc://127.0.0.1:{flight}"', 1)
    config.write_text(text)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 2})
    sent_c: list[Event] = []
    sent_m: list[Event] = []

    def send(topic: str, events: list[Event], into: list[Event]) -> None:
        for key, event in events:
            value = None if event is None else json.dumps(event).encode()
            part = sum(v for v in key.values()) % 2
            producer.produce(topic, value, key=json.dumps(key).encode(), partition=part)
        into.extend(events)
        assert producer.flush(10) == 0

    last: list[str] = []

    def settled() -> bool:
        want_c = fold(sent_c, by_record_key=False)
        want_m = {
            k: {c: v[c] for c in M_COLS} for k, v in fold(sent_m, by_record_key=False).items()
        }
        try:
            for dest in DESTINATIONS:
                got_c = by_key(held(dest, "customers", C_COLS, pg, data), ["id"])
                if got_c != want_c:
                    last[:] = [f"{dest} customers: {got_c} != {want_c}"]
                    return False
                got_m = by_key(held(dest, "memberships", M_COLS, pg, data), M_COLS)
                if got_m != want_m:
                    last[:] = [f"{dest} memberships: {got_m} != {want_m}"]
                    return False
        except Exception as exc:  # a table not made yet
            last[:] = [f"{exc!r}"]
            return False
        return True

    proc = start_gateway(config, log)
    try:
        wait_started(proc)
        for phase in (1, 2):
            send(c_topic, customers(phase), sent_c)
            send(m_topic, memberships(phase), sent_m)
            wait_until(settled, 90, lambda p=phase: f"phase {p}: {last} {log.read_text()[-2000:]}")
        # Phase 3: key 9's events after its earlier flushes, the gateway killed as
        # they arrive, so their commits straddle a SIGKILL.
        send(c_topic, customers(3), sent_c)
        send(m_topic, memberships(3), sent_m)
        time.sleep(0.4)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc = start_gateway(config, log)
        wait_started(proc)
        wait_until(settled, 90, lambda: f"after the kill: {last} {log.read_text()[-2000:]}")
        want = fold(sent_c, by_record_key=False)
        assert (
            want[json.dumps({"id": 2})]["bio"] == "long"
            and want[json.dumps({"id": 9})]["bio"] == "bio-9b"
        )
        assert want[json.dumps({"id": 8})]["__unavailable"] == ["bio"]  # the kit tests what it says
        # The latest view (keyed by the record key: the lone tombstone deleted key 6).
        with thalweg_client.connect(f"grpc://127.0.0.1:{flight}") as client:
            view = client.read(c_topic, view="latest", metadata="none")
        got = by_key(view.select(C_COLS).to_pylist(), ["id"])
        want_view = fold(sent_c, by_record_key=True)
        assert json.dumps({"id": 6}) not in want_view and json.dumps({"id": 6}) in want
        assert got == want_view
        # The truncate is a dead letter with its reason; nothing else is.
        reasons = [
            r
            for f in sorted((data / "dlq").rglob("*.parquet"))
            for r in pq.read_table(f, columns=["_twg_dlq_reason"]).column(0).to_pylist()
        ]
        assert reasons == ["envelope"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert_verified(config)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        pg.stop()
