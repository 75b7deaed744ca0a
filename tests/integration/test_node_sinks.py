"""SQL nodes feeding a sink, on a real broker: a filter node (1 → 0, calling a
WebAssembly function) and an unnest node (1 → N) below it, the unnest node's sink fed
from the topic's lane through both. Every
derived row lands once with its record's locators; a record is covered once all its
derived rows landed; a second pass writes nothing; a query that does not plan against
the lane's schema is refused at start naming the node."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import flight

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import arrow_files, produce_json, wait_until
from thalweg.config import parse_config
from thalweg.embedded import TansuBroker
from thalweg.errors import ConfigError
from thalweg.lane import LaneLayout
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders
from thalweg.verify import verify

pytestmark = pytest.mark.integration

UDF = {
    "name": "double",
    "module": str(Path(__file__).resolve().parents[1] / "data" / "udfs" / "math.wat"),
    "args": ["int64"],
    "returns": "int64",
}


def nodes(query: str = "select unnest(items) as line, * from input") -> list[dict[str, Any]]:
    return [
        {
            "name": "clean",
            "from": "TOPIC",
            "query": "select order_id, double(order_id) as twice, amount, items, _twg_* "
            "from input where amount > 0",
            "materialise": True,  # its own lane too
        },
        {"name": "lines", "from": "clean", "query": query, "sink": "files"},
    ]


def files(data: Path) -> pa.Table:
    return arrow_files(data / "sinks" / "files")


def docs(n: int) -> list[dict[str, Any]]:
    return [
        {"order_id": i, "amount": i % 3 - 1, "items": [f"{i}-{k}" for k in range(i % 4)]}
        for i in range(n)
    ]


def test_a_node_chain_feeds_its_sink_exactly_once_with_locators(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    data = tmp_path / "lane"
    records = docs(600)
    n = produce_json(broker.bootstrap, topic, records)
    pipeline = {
        "nodes": [{**x, "from": topic if x["from"] == "TOPIC" else x["from"]} for x in nodes()],
        "udfs": [UDF],
    }
    sinks = [{"name": "files", "kind": "arrow_ipc", "topics": [topic], "commit_interval_s": 0.3}]
    want = [(d["order_id"], item) for d in records if d["amount"] > 0 for item in d["items"]]
    rg = gateway_factory([topic], data_dir=data, sinks=sinks, pipeline=pipeline)
    rg.wait_durable(topic, {0: n})

    wait_until(lambda: files(data).num_rows == len(want), 60, "the node's sink")
    clean = [d["order_id"] for d in records if d["amount"] > 0]

    def lane_rows() -> list[int]:
        files = sorted((data / "nodes" / "clean").rglob("*.parquet"))
        tables = [pq.read_table(f) for f in files]
        return sorted(x for t in tables if t.num_columns for x in t.column("order_id").to_pylist())

    wait_until(lambda: lane_rows() == clean, 60, "the materialised node's own lane")
    # Served over Flight like a topic: listed, described, read by the thin client.
    gw = thalweg_client.connect(rg.flight_url)
    served = gw.read_node("clean")
    assert sorted(served.column("order_id").to_pylist()) == clean
    assert "_twg_record_id" in served.column_names
    assert gw.nodes() == ["clean", "lines"] and topic in gw.topics()
    assert sorted(gw.read("clean").column("order_id").to_pylist()) == clean  # like a topic
    # Not materialised: derived from clean's lane at read time, the same rows its sink has.
    lines = gw.read_node("lines")
    pairs = zip(lines.column("order_id").to_pylist(), lines.column("line").to_pylist(), strict=True)
    assert sorted(pairs) == sorted(want)
    # And as Flight SQL tables of the schema `nodes`, the same rows.
    with (
        flight_sql.connect(rg.flight_url, autocommit=True) as conn,
        conn.cursor() as cur,
    ):
        cur.execute("select order_id from nodes.clean")
        assert sorted(cur.fetch_arrow_table().column(0).to_pylist()) == clean
        cur.execute("select order_id, line from nodes.lines")
        sql_pairs = cur.fetch_arrow_table().to_pylist()
        schemas = conn.adbc_get_objects(depth="db_schemas").read_all().to_pylist()
    assert sorted((r["order_id"], r["line"]) for r in sql_pairs) == sorted(want)
    listed = {s["db_schema_name"] for s in schemas[0]["catalog_db_schemas"]}
    assert listed == {"decoded", "raw", "dlq", "latest", "nodes"}
    ticket = json.dumps({"topic": topic, "lane": "node:lines", "partitions": [0]}).encode()
    assert gw._flight.do_get(flight.Ticket(ticket)).read_all().num_rows == len(want)
    with pytest.raises(pa.ArrowInvalid, match="unknown node 'nope'"):
        gw.read_node("nope")
    with pytest.raises(pa.ArrowInvalid, match="a node read starts at the earliest"):
        gw.read("lines", start={"offset": 3})
    wait_until(lambda: all(f.lag() == 0 for f in rg.gateway.feeders), 30, "every record covered")
    # Derived once: the sink below the materialised node reads its lane, so the node ran
    # once per record, not once for its lane and again for the sink's chain.
    metrics = urllib.request.urlopen(f"{rg.admin_url}/metrics").read().decode()
    assert f'twg_node_rows_total{{node="clean"}} {float(len(clean))}' in metrics
    assert f'twg_node_rows_total{{node="lines"}} {float(len(want))}' in metrics
    rg.stop()
    got = files(data)
    pairs = sorted(
        zip(got.column("order_id").to_pylist(), got.column("line").to_pylist(), strict=True)
    )
    assert pairs == sorted(want)
    # Every derived row carries its record's locators: offset = order_id here.
    assert got.column("_twg_source_offset").to_pylist() == got.column("order_id").to_pylist()
    assert got.column("_twg_position").to_pylist() == sorted(
        got.column("_twg_position").to_pylist()
    )

    cfg = parse_config(
        {
            "gateway": {"data_dir": str(data)},
            "sources": [rg.gateway.cfg.sources[0].model_dump(mode="json", exclude_none=True)],
            "sinks": sinks,
            "pipeline": pipeline,
        }
    )

    async def one_pass() -> int:
        rows = 0
        for f in build_feeders(cfg, LaneLayout(data), MetadataColumns("_twg_")):
            try:
                await f.open()
                rows += (await f.pass_once(final=True)).rows
            finally:
                await f.close()
        return rows

    assert asyncio.run(one_pass()) == 0
    bad = {
        "udfs": [UDF],
        "nodes": [
            {**x, "from": topic if x["from"] == "TOPIC" else x["from"]}
            for x in nodes("select nope, * from input")
        ],
    }
    cfg_bad = parse_config(
        {**cfg.model_dump(mode="json", exclude_none=True, by_alias=True), "pipeline": bad}
    )
    with pytest.raises(ConfigError, match=r"pipeline\.nodes\.lines: the query does not plan"):
        build_feeders(cfg_bad, LaneLayout(data), MetadataColumns("_twg_"))

    # twg verify on the node-fed sink: its coverage checked (derived rows have no
    # one-to-one count), clean — then a file of it lost: its own record (the file names)
    # no longer claims what the coverage store does, an error naming the sink.
    report = verify(cfg, broker=False)
    assert report.ok, report.as_text()
    assert report.sinks["files"]["derived"] is True
    sorted((data / "sinks" / "files").rglob("*.arrow"))[0].unlink()
    planted = verify(cfg, broker=False)
    errors = {(f.code, f.where) for f in planted.findings if f.level == "error"}
    assert ("store_ahead", f"sink files: {topic}[0]") in errors, planted.as_text()


STRICT = """
apiVersion: v3.0.2
kind: DataContract
version: 1.0.0
schema:
  - name: orders
    properties:
      - name: amount
        logicalType: integer
        logicalTypeOptions: {minimum: 0}
"""


def test_a_strict_quality_node_stops_its_sink_and_nothing_else(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    data = tmp_path / "lane"
    contract = tmp_path / "orders.yaml"
    contract.write_text(STRICT)
    pipeline = {
        "nodes": [
            {
                "name": "dq",
                "from": topic,
                "contract": str(contract),
                "mode": "strict",
                "sink": "files",
            }
        ]
    }
    sinks = [{"name": "files", "kind": "arrow_ipc", "topics": [topic], "commit_interval_s": 0.2}]
    rg = gateway_factory([topic], data_dir=data, sinks=sinks, pipeline=pipeline)
    good = produce_json(broker.bootstrap, topic, ({"n": i, "amount": 1} for i in range(200)))
    rg.wait_durable(topic, {0: good})
    wait_until(lambda: files(data).num_rows == good, 60, "the good records land")
    more = produce_json(
        broker.bootstrap, topic, ({"n": good + i, "amount": -1 if i == 5 else 1} for i in range(50))
    )
    rg.wait_durable(topic, {0: good + more})  # the raw lane and the commits go on
    health = rg.gateway.health

    def stopped() -> bool:
        return health.state("sink:files").value == "degraded"

    wait_until(stopped, 30, "the sink stopped by its strict node")
    assert health.ready()
    detail = json.loads(urllib.request.urlopen(f"{rg.admin_url}/health").read())
    text = json.dumps(detail)
    assert "strict" in text and f"stopped at position {good + 5}" in text
    metrics = urllib.request.urlopen(f"{rg.admin_url}/metrics").read().decode()
    assert 'twg_sink_errors_total{reason="contract",sink="files"}' in metrics
    time.sleep(1.0)
    landed = sorted(files(data).column("n").to_pylist())
    # Nothing skipped: a prefix, stopped at the batch holding the bad record.
    assert good <= len(landed) <= good + 5 and landed == list(range(len(landed)))
    assert rg.gateway.feeders[0].lag() >= more
    rg.stop()


def test_a_node_is_followed_across_history_and_the_live_edge(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=2)
    pipeline = {
        "nodes": [{**x, "from": topic if x["from"] == "TOPIC" else x["from"]} for x in nodes()],
        "udfs": [UDF],
    }
    sinks = [{"name": "files", "kind": "arrow_ipc", "topics": [topic], "commit_interval_s": 0.3}]
    rg = gateway_factory([topic], data_dir=tmp_path / "lane", sinks=sinks, pipeline=pipeline)
    records = docs(400)
    first = produce_json(broker.bootstrap, topic, records[:200], partition=lambda i: i % 2)
    rg.wait_durable(topic, {0: first // 2, 1: first // 2})
    gw = thalweg_client.connect(rg.flight_url)
    got: list[tuple[int, str]] = []
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            for batch in gw.stream("lines", end="follow"):
                got.extend(
                    zip(
                        batch.column("order_id").to_pylist(),
                        batch.column("line").to_pylist(),
                        strict=True,
                    )
                )
        except BaseException as exc:  # ended by close(); anything else is reported
            errors.append(exc)

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    want_first = [(d["order_id"], i) for d in records[:200] if d["amount"] > 0 for i in d["items"]]
    wait_until(lambda: len(got) >= len(want_first), 60, "the history")
    produce_json(broker.bootstrap, topic, records[200:], partition=lambda i: i % 2)
    want = [(d["order_id"], i) for d in records if d["amount"] > 0 for i in d["items"]]
    wait_until(lambda: len(got) >= len(want), 60, "the live edge")
    time.sleep(1.0)  # nothing more, nothing twice
    gw.close()
    reader.join(10)
    rg.stop()
    assert sorted(got) == sorted(want)
    assert all("Cancelled" in type(e).__name__ or "cancel" in str(e).lower() for e in errors)
