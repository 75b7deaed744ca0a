"""A node that refuses some records — a runtime SQL error, a WebAssembly function out of
fuel — costs only those records: the chain isolates them by halving (a record's rows
stay together), names them with the reason (``transform``, ``udf_exhausted``) and the
error, and the rest go on. Their raw records are written to the node's dead-letter lane,
named after the raw segment, so a replay replaces the verdict rather than adding one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from thalweg.config.pipeline import PipelineConfig, UdfConfig
from thalweg.lane.layout import Lane, LaneLayout, Segment, segment_name
from thalweg.pipeline.dag import Chain, Dag
from thalweg.pipeline.udf import WasmUdf
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.dead_letters import NodeDeadLetters

COLS = MetadataColumns("_twg_")
WAT = Path(__file__).resolve().parents[2] / "data" / "udfs" / "math.wat"


def chain(*nodes: dict[str, Any], udfs: list[WasmUdf] = ()) -> Chain:  # type: ignore[assignment]
    dag = Dag.of(PipelineConfig.model_validate({"nodes": list(nodes)}))
    return Chain(dag, dag.nodes[-1].name, COLS, udfs=[u.udf for u in udfs])


def records(amounts: list[int], items: list[list[int]] | None = None) -> pa.Table:
    n = len(amounts)
    cols: dict[str, Any] = {f.name: pa.nulls(n, f.type) for f in COLS.locator_fields}
    cols["_twg_position"] = pa.array(np.arange(100, 100 + n), pa.int64())
    cols["_twg_record_id"] = pa.array([i.to_bytes(16, "big") for i in range(n)], pa.binary(16))
    cols["amount"] = pa.array(amounts, pa.int64())
    cols["items"] = pa.array(items or [[1]] * n, pa.list_(pa.int64()))
    return pa.table(cols)


DIVIDE = {"name": "ratio", "from": "t", "query": "select 1000 / amount as r, _twg_* from input"}


def test_a_runtime_sql_error_costs_only_the_records_that_cause_it() -> None:
    amounts = [5] * 1000
    amounts[17] = amounts[600] = 0
    out = chain(DIVIDE).apply(records(amounts))
    assert out.rows.num_rows == 998
    assert 117 not in out.rows.column("_twg_position").to_pylist()
    assert out.rows.column("_twg_position").to_pylist() == sorted(
        out.rows.column("_twg_position").to_pylist()
    )
    refused = sorted(int(p) for r in out.rejected for p in r.positions)
    assert refused == [117, 700]
    assert {r.reason for r in out.rejected} == {"transform"}
    assert all("Divide by zero" in r.error and r.node == "ratio" for r in out.rejected)


def test_a_records_rows_are_refused_together_below_an_unnest() -> None:
    lines = {"name": "lines", "from": "t", "query": "select unnest(items) as n, _twg_* from input"}
    per_line = {"name": "per_line", "from": "lines", "query": "select 10 / n as r, * from input"}
    table = records([1, 1, 1], items=[[1, 2], [3, 0, 4], [5]])
    out = chain(lines, per_line).apply(table)
    assert out.rows.column("_twg_position").to_pylist() == [100, 100, 102]
    assert out.rows.column("_twg_derived_index").to_pylist() == [0, 1, 0]
    (rejected,) = out.rejected
    assert rejected.node == "per_line" and rejected.positions.tolist() == [101]


def test_a_runaway_webassembly_call_is_udf_exhausted_and_the_rest_goes_on() -> None:
    spin = WasmUdf(
        UdfConfig.model_validate(
            {
                "name": "spin_neg",
                "module": WAT,
                "args": ["int64"],
                "returns": "int64",
                "fuel": 20_000,
            }
        )
    )
    node = {
        "name": "guard",
        "from": "t",
        "query": "select spin_neg(amount) as a, _twg_* from input",
    }
    amounts = list(range(64))
    amounts[40] = -3
    out = chain(node, udfs=[spin]).apply(records(amounts))
    assert out.rows.column("a").to_pylist() == [a for a in amounts if a >= 0]
    (rejected,) = out.rejected
    assert rejected.reason == "udf_exhausted" and rejected.positions.tolist() == [140]
    assert rejected.error.startswith("pipeline.udfs.spin_neg: udf_exhausted:")


def test_when_every_record_fails_the_calls_stay_bounded_and_all_are_named() -> None:
    calls = 0
    c = chain(DIVIDE)
    run = c._call

    def counted(node: Any, table: pa.Table, **kw: Any) -> pa.Table:
        nonlocal calls
        calls += 1
        return run(node, table, **kw)

    c._call = counted  # type: ignore[method-assign]
    out = c.apply(records([0] * 5000))
    assert out.rows.num_rows == 0 and out.rows.schema.names[0] == "r"
    refused = np.concatenate([r.positions for r in out.rejected])
    assert sorted(refused.tolist()) == list(range(100, 5100))
    assert calls <= 4 * 13 + 16 + 1


def test_dead_letters_hold_the_raw_records_and_a_replay_replaces_them(tmp_path: Path) -> None:
    raw_dir = LaneLayout(tmp_path).partition_dir(Lane.RAW, "t", 0)
    raw_dir.mkdir(parents=True)
    raw = pa.table(
        {
            "_twg_source_value": pa.array([b"a", b"b", b"c", b"d"]),
            "_twg_position": pa.array([100, 101, 102, 103], pa.int64()),
        }
    )
    seg = Segment(100, 103, raw_dir / segment_name(100, 103))
    pq.write_table(raw, seg.path)
    dead = NodeDeadLetters(LaneLayout(tmp_path), ["ratio", "other"], COLS)
    out = chain(DIVIDE).apply(records([1, 0, 2, 0]))
    dead.record("t", 0, seg, out.rejected)
    path = dead.path("ratio", "t", 0, seg)
    assert path == tmp_path / "nodes" / "ratio" / "dlq" / "topic=t" / "partition=0" / seg.path.name
    got = pq.read_table(path)
    assert got.column("_twg_source_value").to_pylist() == [b"b", b"d"]
    assert got.column("_twg_dlq_reason").to_pylist() == ["transform", "transform"]
    assert got.column("_twg_dlq_stage").to_pylist() == ["node:ratio", "node:ratio"]
    assert not dead.path("other", "t", 0, seg).exists()
    dead.record("t", 0, seg, out.rejected)  # the same replay: the same file, once
    assert pq.read_table(path).num_rows == 2
    dead.record("t", 0, seg, ())  # refused no more (a fixed sidecar): they landed instead
    assert not path.exists()
