"""Sidecar transforms over Flight ``do_exchange``: the wire contract (golden shapes),
failures, and ``examples/sidecar_enrich.py`` as a node of a running gateway, killed
mid-stream and restarted — every record transformed exactly once in the node's sink."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyarrow import flight

from tests.conftest import RunningGateway
from tests.helpers import arrow_files, produce_json, wait_until
from tests.tls_certs import make_pki
from thalweg.config.pipeline import NodeConfig, PipelineConfig
from thalweg.embedded import TansuBroker, free_port
from thalweg.pipeline.dag import Chain, Dag
from thalweg.records.columns import MetadataColumns
from thalweg.sidecars import (
    SidecarClient,
    SidecarContractError,
    SidecarRefusedError,
    SidecarUnavailableError,
)
from thalweg_client.sidecar import ROW_INDEX, Sidecar

pytestmark = pytest.mark.integration

COLS = MetadataColumns("_twg_")
ROOT = Path(__file__).resolve().parents[2]


def records(n: int) -> pa.Table:
    locators = {f.name: pa.nulls(n, f.type) for f in COLS.locator_fields}
    locators["_twg_position"] = pa.array(range(n), pa.int64())
    locators["_twg_record_id"] = pa.array([i.to_bytes(16, "big") for i in range(n)], pa.binary(16))
    return pa.table({"amount": pa.array([i * 10 for i in range(n)], pa.int64()), **locators})


class Shapes(Sidecar):
    """One command per shape of the contract."""

    asked = 0

    def transform(self, command: str, batch: pa.RecordBatch) -> pa.RecordBatch | pa.Table:
        if command == "append":  # locators kept: a computed column
            return batch.append_column("double", pc.multiply(batch.column("amount"), 2))
        if command == "explode":  # new rows, tied to their input by the row index
            idx = [i for i in range(batch.num_rows) for _ in range(i % 3)]
            return pa.table({ROW_INDEX: pa.array(idx, pa.int64()), "k": pa.array(range(len(idx)))})
        if command == "filter":  # 1 → 0 for odd positions
            return batch.filter(pc.equal(pc.bit_wise_and(batch.column("_twg_position"), 1), 0))
        if command == "lose":  # breaks the contract: neither locators nor an index
            return pa.table({"amount": batch.column("amount")})
        if command == "picky":  # refuses any batch holding amount 30 (position 3)
            self.asked += 1
            if 30 in batch.column("amount").to_pylist():
                raise ValueError("amount 30 is not allowed")
            return batch
        raise ValueError(f"unknown command {command}")


@pytest.fixture
def shapes() -> Iterator[Shapes]:
    server = Shapes(token="s3cret")
    yield server
    server.shutdown()


def client(port: int, command: str, **kw: Any) -> SidecarClient:
    node = NodeConfig.model_validate(
        {
            "name": "n",
            "from": "t",
            "sidecar": f"grpc://127.0.0.1:{port}",
            "command": command,
            "token": kw.pop("token", "s3cret"),
            "timeout_s": 5,
        }
    )
    return SidecarClient(node, COLS, batch_rows=7, in_flight=2, **kw)


def test_the_contract_shapes_tie_every_row_to_its_record(shapes: Shapes) -> None:
    table = records(20)  # three batches of at most 7 rows: in flight, in order
    out = client(shapes.port, "append")(table)
    assert out.column("double").to_pylist() == [i * 20 for i in range(20)]
    assert out.column("_twg_position").to_pylist() == list(range(20))
    out = client(shapes.port, "explode")(table)
    want = [p for b in range(0, 20, 7) for i in range(min(7, 20 - b)) for p in [b + i] * (i % 3)]
    assert out.column("_twg_position").to_pylist() == want  # locators taken by the index
    assert ROW_INDEX not in out.column_names
    assert out.column("_twg_record_id").to_pylist() == [p.to_bytes(16, "big") for p in want]
    out = client(shapes.port, "filter")(table)
    assert out.column("_twg_position").to_pylist() == list(range(0, 20, 2))
    assert client(shapes.port, "append")(table.slice(0, 0)).num_rows == 0
    with pytest.raises(SidecarContractError, match="neither the locator columns"):
        client(shapes.port, "lose")(table)


def test_a_wrong_token_or_a_dead_sidecar_is_unavailable_and_opens_the_circuit(
    shapes: Shapes,
) -> None:
    with pytest.raises(SidecarUnavailableError, match="bearer token"):
        client(shapes.port, "append", token="wrong", retries=0)(records(3))
    dead = client(free_port(), "append", retries=1, breaker_failures=2, breaker_open_s=60)
    with pytest.raises(SidecarUnavailableError):
        dead(records(3))
    started = time.monotonic()
    with pytest.raises(SidecarUnavailableError, match="circuit open"):
        dead(records(3))
    assert time.monotonic() - started < 0.5  # failed at once, no connection tried


def test_a_sidecar_back_from_an_outage_is_probed_half_open_and_called_again() -> None:
    """While the circuit is open one call in a probe interval goes through (half-open);
    the first that reaches the sidecar closes it. The wait between probes doubles up to
    ``breaker_open_s`` and every refusal says when the next probe is due."""
    port = free_port()
    gone = client(port, "append", retries=0, breaker_failures=2, probe_s=0.2, breaker_open_s=1)
    for _ in range(2):  # two failed calls open the circuit
        with pytest.raises(SidecarUnavailableError):
            gone(records(3))
    with pytest.raises(SidecarUnavailableError, match="circuit open") as refused:
        gone(records(3))
    assert 0 < refused.value.retry_after_s <= 0.2
    time.sleep(refused.value.retry_after_s)
    with pytest.raises(SidecarUnavailableError) as probed:  # the probe: still down
        gone(records(3))
    assert 0.2 < probed.value.retry_after_s <= 0.4  # the next probe waits twice as long
    server = Shapes(f"grpc://127.0.0.1:{port}", token="s3cret")  # back on its port
    try:
        with pytest.raises(SidecarUnavailableError, match="circuit open") as waiting:
            gone(records(3))
        time.sleep(waiting.value.retry_after_s)
        out = gone(records(3))  # the probe reaches it: closed again
        assert out.column("double").to_pylist() == [0, 20, 40]
        assert gone(records(2)).num_rows == 2
    finally:
        server.shutdown()


def test_rows_the_sidecar_refuses_are_retried_then_isolated_and_named(shapes: Shapes) -> None:
    picky = client(shapes.port, "picky", retries=2)
    started = shapes.asked
    with pytest.raises(SidecarRefusedError, match="refused 20 rows 3 times: amount 30"):
        picky(records(20))
    assert shapes.asked - started >= 3  # each try reached the sidecar (batches of 7)
    assert picky(records(3).slice(0, 3)).num_rows == 3  # not counted towards the breaker
    dag = Dag.of(
        PipelineConfig.model_validate(
            {"nodes": [{"name": "n", "from": "t", "sidecar": "grpc://x:1", "command": "picky"}]}
        )
    )
    chain = Chain(dag, "n", COLS, sidecar_for=lambda _: picky)
    out = chain.apply(records(20))
    assert out.rows.column("_twg_position").to_pylist() == [p for p in range(20) if p != 3]
    (rejected,) = out.rejected
    assert rejected.positions.tolist() == [3] and rejected.reason == "transform"
    assert "amount 30 is not allowed" in rejected.error


def test_a_tls_sidecar_is_trusted_through_its_private_ca(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    server = Shapes(
        "grpc+tls://127.0.0.1:0",
        tls_certificates=[flight.CertKeyPair(pki.pem("server_cert"), pki.pem("server_key"))],
    )
    try:
        location = f"grpc+tls://127.0.0.1:{server.port}"

        def tls_client(**kw: Any) -> SidecarClient:
            node = NodeConfig.model_validate(
                {"name": "n", "from": "t", "sidecar": location, "command": "append", **kw}
            )
            return SidecarClient(node, COLS, retries=0)

        out = tls_client(tls_root_certs=str(pki.ca))(records(5))
        assert out.column("double").to_pylist() == [i * 20 for i in range(5)]
        for untrusted in ({}, {"tls_root_certs": str(pki.other_ca)}):  # system roots, a stranger
            with pytest.raises(SidecarUnavailableError):
                tls_client(**untrusted)(records(5))
        with pytest.raises(ValueError, match="tls_root_certs needs a grpc\\+tls:// sidecar"):
            NodeConfig.model_validate(
                {
                    "name": "n",
                    "from": "t",
                    "sidecar": "grpc://127.0.0.1:1",
                    "command": "x",
                    "tls_root_certs": str(pki.ca),
                }
            )
    finally:
        server.shutdown()


def start_example(port: int, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "sidecar_enrich.py"),
            "--listen",
            f"grpc://127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=open(log, "ab"),  # noqa: SIM115
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(b"sidecar listening"), line
    return proc


def poison(n: int) -> bool:
    """The orders the example sidecar refuses (a negative amount)."""
    return n % 1000 == 7


def test_the_example_sidecar_killed_mid_stream_transforms_every_record_once(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    port = free_port()
    sidecar = start_example(port, tmp_path / "sidecar.log")
    topic = topic_factory(partitions=2)
    data = tmp_path / "lane"
    pipeline = {
        "nodes": [
            {
                "name": "tiered",
                "from": topic,
                "sidecar": f"grpc://127.0.0.1:{port}",
                "command": "tier",
                "sink": "files",
            }
        ]
    }
    sinks = [{"name": "files", "kind": "arrow_ipc", "topics": [topic], "commit_interval_s": 0.2}]
    rg = gateway_factory(
        [topic], data_dir=data, sinks=sinks, pipeline=pipeline, recovery={"retry_max_s": 1}
    )

    def order(n: int) -> dict[str, int]:
        return {"n": n, "amount": -1 if poison(n) else n % 200}

    try:
        first = produce_json(
            broker.bootstrap, topic, (order(i) for i in range(3000)), partition=lambda i: i % 2
        )

        def landed() -> int:
            return arrow_files(data / "sinks" / "files").num_rows

        wait_until(lambda: landed() > 0, 60, "first enriched rows")
        os.killpg(sidecar.pid, signal.SIGKILL)  # mid-stream: more records keep coming
        sidecar.wait(10)
        more = produce_json(
            broker.bootstrap,
            topic,
            (order(first + i) for i in range(3000)),
            partition=lambda i: i % 2,
        )
        total = first + more
        refused = [n for n in range(total) if poison(n)]
        rg.wait_durable(topic, {0: total // 2, 1: total // 2})
        wait_until(lambda: rg.gateway.health.state("sink:files").value == "down", 30, "sink down")
        assert rg.gateway.health.ready()  # the raw lane and commits go on
        sidecar = start_example(port, tmp_path / "sidecar.log")
        wait_until(
            lambda: landed() == total - len(refused), 120, "every record enriched after the restart"
        )
        wait_until(lambda: all(f.lag() == 0 for f in rg.gateway.feeders), 60, "all covered")
        rg.stop()
    finally:
        if sidecar.poll() is None:
            os.killpg(sidecar.pid, signal.SIGKILL)
    table = arrow_files(data / "sinks" / "files")
    good = [n for n in range(total) if not poison(n)]
    assert sorted(table.column("n").to_pylist()) == good  # once each
    tiers = dict(zip(table.column("n").to_pylist(), table.column("tier").to_pylist(), strict=True))
    assert all(tiers[n] == ("gold" if (n % 3000) % 200 > 100 else "basic") for n in tiers)
    # The refused orders: in the node's dead-letter lane once each, as raw records with
    # their locators and why — after the sidecar refused them on every try.
    dead = pa.concat_tables(
        [pq.read_table(f) for f in sorted((data / "nodes" / "tiered" / "dlq").rglob("*.parquet"))]
    )
    ns = [json.loads(p)["n"] for p in dead.column("_twg_source_value").to_pylist()]
    assert sorted(ns) == refused
    assert set(dead.column("_twg_dlq_reason").to_pylist()) == {"transform"}
    assert set(dead.column("_twg_dlq_stage").to_pylist()) == {"node:tiered"}
    assert all("amount cannot be negative" in e for e in dead.column("_twg_dlq_error").to_pylist())
    assert all("times" in e for e in dead.column("_twg_dlq_error").to_pylist())
    assert dead.column("_twg_source_offset").null_count == 0
    assert dead.column("_twg_source_topic").to_pylist() == [topic] * len(refused)


class Hang(Sidecar):
    """Stops answering until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def transform(self, command: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        self.release.wait(60)
        return batch


def hung_node(topic: str, hang: Hang) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A node ``slow`` of ``topic`` through ``hang``, feeding an Arrow IPC sink ``files``."""
    node = {
        "name": "slow",
        "from": topic,
        "sidecar": f"grpc://127.0.0.1:{hang.port}",
        "command": "x",
        "sink": "files",
        "timeout_s": 60,
    }
    sinks = [{"name": "files", "kind": "arrow_ipc", "topics": [topic], "commit_interval_s": 0.2}]
    return {"nodes": [node]}, sinks


def test_a_stalled_sidecar_is_named_by_stats_and_metrics_alone(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    hang = Hang()
    topic = topic_factory(partitions=1)
    pipeline, sinks = hung_node(topic, hang)
    rg = gateway_factory(
        [topic],
        data_dir=tmp_path / "lane",
        sinks=sinks,
        pipeline=pipeline,
        gateway={"stall_after_s": 1.0},
    )
    try:
        n = produce_json(broker.bootstrap, topic, ({"n": i} for i in range(500)))
        rg.wait_durable(topic, {0: n})

        def stalled() -> bool:
            stats = json.loads(urllib.request.urlopen(f"{rg.admin_url}/stats").read())
            return "node:slow" in stats["stalled"]

        wait_until(stalled, 30, "/stats naming the stalled node")
        text = urllib.request.urlopen(f"{rg.admin_url}/metrics").read().decode()
        depth = [
            ln for ln in text.splitlines() if ln.startswith('twg_node_queue_depth{node="slow"}')
        ]
        assert depth and float(depth[0].split()[-1]) > 0, depth
        assert rg.gateway.health.ready()  # ingest is not held by the node
    finally:
        hang.release.set()
        rg.stop()
        hang.shutdown()


def test_a_lag_bound_holds_the_source_until_the_node_below_catches_up(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    hang = Hang()
    topic = topic_factory(partitions=1)
    pipeline, sinks = hung_node(topic, hang)
    rg = gateway_factory(
        [topic],
        data_dir=tmp_path / "lane",
        sinks=sinks,
        pipeline=pipeline,
        recovery={"max_lag_records": 300, "poll_interval_s": 0.2},
    )
    try:
        first = produce_json(broker.bootstrap, topic, ({"n": i} for i in range(500)))
        rg.wait_durable(topic, {0: first})
        health = rg.gateway.health

        def paused() -> bool:
            text = urllib.request.urlopen(f"{rg.admin_url}/metrics").read().decode()
            return any(
                ln.startswith("twg_source_paused") and ln.endswith(" 1.0")
                for ln in text.splitlines()
            )

        wait_until(paused, 30, "the source paused by the node's lag")
        why = urllib.request.urlopen(f"{rg.admin_url}/health").read().decode()
        assert "files lags" in why and "max_lag_records = 300" in why  # says why
        more = produce_json(broker.bootstrap, topic, ({"n": first + i} for i in range(1500)))
        time.sleep(3.0)
        assert rg.gateway.catalog.durable_end(topic, 0) == first  # held: nothing fetched
        assert health.ready()  # waiting on purpose is not a failure
        hang.release.set()  # the node answers again: it catches up, the source resumes
        rg.wait_durable(topic, {0: first + more}, timeout=60)
        wait_until(
            lambda: arrow_files(tmp_path / "lane" / "sinks" / "files").num_rows == first + more,
            60,
            "every record through the node",
        )
        assert not paused()
    finally:
        hang.release.set()
        rg.stop()
        hang.shutdown()
