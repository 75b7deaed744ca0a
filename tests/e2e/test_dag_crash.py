"""A three-level DAG under SIGKILL (the plan's Phase 9 exit): the raw lane; an unpacking
node (a filter) with its own sink and data-quality leaves — a quarantining contract
node with a sink, and its audit with a sink; an unnest node below it with its own sink.
``twg stream`` is SIGKILLed four times while records stream in; afterwards each node's
sink holds every derived row exactly once (Arrow IPC files: exactly-once by their
names), each quarantined record is in the contract node's dead-letter lane once, the
audit judged every record in exactly one batch, and the source's commits never led the
raw lane."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from tests.e2e.test_crash_exactness import config_text, start_gateway, wait_started
from tests.e2e.test_sink_recovery import make_topic
from tests.helpers import arrow_files, assert_verified, committed_offsets, seeded_rng, wait_until
from thalweg.embedded import TansuBroker
from thalweg.lane import LaneLayout, scan_coverage

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOTAL = 30_000


CONTRACT = """
apiVersion: v3.0.2
kind: DataContract
id: unpacked-orders
version: 2.0.0
schema:
  - name: orders
    quality:
      - name: not a multiple of seven plus three
        type: custom
        engine: datafusion
        implementation: "n % 7 <> 3"
      - name: some rows
        type: library
        metric: rowCount
        mustBeGreaterThan: 0
"""


def quarantined(n: int) -> bool:
    return n % 7 == 3


def config(path: Path, bootstrap: str, topic: str, group: str, data: Path) -> None:
    contract = path.parent / "unpacked.yaml"
    contract.write_text(CONTRACT)
    dag = f"""
[recovery]
poll_interval_s = 0.2

[[pipeline.nodes]]
name = "unpacked_dq"
from = "unpacked"
contract = "{contract}"
mode = "quarantine"
sink = "dq_files"

[[pipeline.nodes]]
name = "unpacked_audit"
from = "unpacked_dq"
audit = true
sink = "audit_files"

[[pipeline.nodes]]
name = "unpacked"
from = "{topic}"
query = "select n, amount, items, _twg_* from input where amount > 0"
sink = "unpacked_files"

[[pipeline.nodes]]
name = "lines"
from = "unpacked"
query = "select unnest(items) as line, n, _twg_* from input"
sink = "line_files"

[[sinks]]
name = "unpacked_files"
kind = "arrow_ipc"
topics = ["{topic}"]
commit_interval_s = 0.3

[[sinks]]
name = "line_files"
kind = "arrow_ipc"
topics = ["{topic}"]
commit_interval_s = 0.3

[[sinks]]
name = "dq_files"
kind = "arrow_ipc"
topics = ["{topic}"]
commit_interval_s = 0.3

[[sinks]]
name = "audit_files"
kind = "arrow_ipc"
topics = ["{topic}"]
commit_interval_s = 0.3
"""
    path.write_text(config_text(bootstrap, topic, group, data, roll_rows=4000, extra=dag))


def doc(i: int) -> dict[str, object]:
    return {"n": i, "amount": i % 3 - 1, "items": [f"{i}:{k}" for k in range(i % 4)]}


def rows(data: Path, sink: str) -> pa.Table:
    return arrow_files(data / "sinks" / sink)


def test_sigkill_during_a_three_level_dag_leaves_every_derived_row_once(
    broker: TansuBroker, tmp_path: Path
) -> None:
    topic = make_topic(broker.bootstrap, "dag")
    group = f"dag-{uuid.uuid4().hex[:8]}"
    data, cfg, log = tmp_path / "lane", tmp_path / "twg.toml", tmp_path / "gw.log"
    config(cfg, broker.bootstrap, topic, group, data)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 10, "log_level": 2})
    rng = seeded_rng("THALWEG_DAG_CRASH_SEED")
    proc = start_gateway(cfg, log)
    layout = LaneLayout(data)
    violations: list[str] = []
    try:
        sent = 0
        for _kill in range(4):
            deadline = time.monotonic() + rng.uniform(1.5, 3.0)
            while time.monotonic() < deadline and sent < TOTAL:
                for _ in range(500):
                    producer.produce(topic, json.dumps(doc(sent)).encode(), partition=sent % 2)
                    sent += 1
                producer.poll(0)
                time.sleep(0.05)
            committed = committed_offsets(broker.bootstrap, group, topic, range(2))
            for p, off in committed.items():
                end = scan_coverage(layout, topic, p).end or 0
                if off > end:
                    violations.append(f"p{p}: committed {off} > lane {end}")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            proc = start_gateway(cfg, log)
        while sent < TOTAL:
            producer.produce(topic, json.dumps(doc(sent)).encode(), partition=sent % 2)
            sent += 1
            if sent % 2000 == 0:
                producer.poll(0)
        assert producer.flush(30) == 0
        want_unpacked = [i for i in range(TOTAL) if doc(i)["amount"] > 0]  # type: ignore[operator]
        want_lines = sorted(f"{i}:{k}" for i in want_unpacked for k in range(i % 4))

        def alive() -> None:
            assert proc.poll() is None, log.read_text()[-2000:]

        want_dq = [i for i in want_unpacked if not quarantined(i)]

        def audited() -> int:
            audit = rows(data, "audit_files")
            if not audit.num_rows:
                return 0
            some = pc.equal(audit.column("rule"), "some rows")
            return int(pc.sum(audit.filter(some).column("batch_rows")).as_py())

        wait_until(
            lambda: (
                rows(data, "line_files").num_rows == len(want_lines)
                and rows(data, "unpacked_files").num_rows == len(want_unpacked)
                and rows(data, "dq_files").num_rows == len(want_dq)
                and audited() == len(want_unpacked)
            ),
            120,
            "every node sink complete",
            interval=0.5,
            check=alive,
        )
        wait_started(proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    assert violations == [], violations
    unpacked = rows(data, "unpacked_files")
    assert sorted(unpacked.column("n").to_pylist()) == want_unpacked  # once each
    lines = rows(data, "line_files")
    assert sorted(lines.column("line").to_pylist()) == want_lines  # once each
    # Locators: each derived row's offset is its record's.
    n = lines.column("n").to_pylist()
    offsets = lines.column("_twg_source_offset").to_pylist()
    parts = lines.column("_twg_source_partition").to_pylist()
    assert all(o == i // 2 and p == i % 2 for i, o, p in zip(n, offsets, parts, strict=True))
    # The quality leaves: passing records once in its sink, the others once in its
    # dead-letter lane (raw records with their locators), every record judged once.
    assert sorted(rows(data, "dq_files").column("n").to_pylist()) == want_dq
    # The materialised nodes' own lanes (unpacked has three dependents, unpacked_dq two):
    # each derived row once, and the sinks below them read those lanes.
    for node, want in (("unpacked", want_unpacked), ("unpacked_dq", want_dq)):
        lane = [
            pq.read_table(f)
            for f in sorted((data / "nodes" / node).glob("topic=*/partition=*/*.parquet"))
        ]
        assert sorted(n for t in lane if t.num_rows for n in t.column("n").to_pylist()) == want
    dead = pa.concat_tables(
        pq.read_table(f)
        for f in sorted((data / "nodes" / "unpacked_dq" / "dlq").rglob("*.parquet"))
    )
    dead_n = sorted(json.loads(v)["n"] for v in dead.column("_twg_source_value").to_pylist())
    assert dead_n == [i for i in want_unpacked if quarantined(i)]
    assert set(dead.column("_twg_dlq_reason").to_pylist()) == {"quality"}
    audit = rows(data, "audit_files")
    keys = list(
        zip(
            audit.column("_twg_source_partition").to_pylist(),
            audit.column("batch_first_position").to_pylist(),
            audit.column("rule").to_pylist(),
            strict=True,
        )
    )
    assert len(keys) == len(set(keys))  # one verdict per rule and batch
    custom = audit.filter(pc.equal(audit.column("rule"), "not a multiple of seven plus three"))
    assert int(pc.sum(custom.column("value")).as_py()) == len(dead_n)
    assert all(v.startswith("2.0.0#") for v in audit.column("rule_version").to_pylist())
    assert_verified(cfg)  # the node-fed sinks: their coverage against the lane
