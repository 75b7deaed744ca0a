"""Data quality in the DAG: a node enforcing an ODCS contract in each mode — quarantine
(breaking records refused, each with its rule's message), annotate (a verdict column,
every row passes), strict (the node stops at the first broken rule, naming it and the
record) — dataset-level rules judged over each batch (row count, duplicates, thresholds
in rows and percent, SQL), and the audit node: one verdict row per rule and batch, its
version stamped, with the batch's first record's locators."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import yaml

from thalweg.config.pipeline import PipelineConfig
from thalweg.errors import ConfigError
from thalweg.pipeline.dag import Chain, Dag
from thalweg.pipeline.quality import ContractStopError
from thalweg.records.columns import MetadataColumns

COLS = MetadataColumns("_twg_")


def contract(tmp_path: Path, *, dataset: bool = True, version: str = "1.2.0") -> Path:
    body: dict[str, Any] = {
        "apiVersion": "v3.0.2",
        "kind": "DataContract",
        "id": "orders-contract",
        "version": version,
        "schema": [
            {
                "name": "orders",
                "properties": [
                    {
                        "name": "amount",
                        "logicalType": "number",
                        "logicalTypeOptions": {"minimum": 0},
                    },
                    {
                        "name": "status",
                        "quality": [
                            {
                                "type": "library",
                                "metric": "invalidValues",
                                "arguments": {"validValues": ["new", "paid"]},
                                "mustBe": 0,
                            }
                        ],
                    },
                    {
                        "name": "order_id",
                        "quality": [
                            {"type": "library", "metric": "duplicateValues", "mustBe": 0},
                        ]
                        if dataset
                        else [],
                    },
                    {
                        "name": "customer",
                        "quality": [
                            {
                                "type": "library",
                                "metric": "nullValues",
                                "mustBeLessThan": 50,
                                "unit": "percent",
                            }
                        ]
                        if dataset
                        else [],
                    },
                ],
                "quality": [
                    {
                        "name": "some rows",
                        "type": "library",
                        "metric": "rowCount",
                        "mustBeGreaterThan": 0,
                    },
                    {
                        "name": "few big orders",
                        "type": "sql",
                        "query": "select count(*) from {object} where amount > 1000",
                        "mustBeLessThan": 2,
                    },
                ]
                if dataset
                else [],
            }
        ],
    }
    path = tmp_path / "orders.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def batch(
    amount: list[float],
    status: list[str],
    order_id: list[int],
    customer: list[Any],
    items: list[list[int]] | None = None,
) -> pa.Table:
    n = len(amount)
    cols: dict[str, Any] = {f.name: pa.nulls(n, f.type) for f in COLS.locator_fields}
    cols["_twg_position"] = pa.array(np.arange(50, 50 + n), pa.int64())
    cols["_twg_record_id"] = pa.array([i.to_bytes(16, "big") for i in range(n)], pa.binary(16))
    cols["_twg_source_partition"] = pa.array([3] * n, pa.int32())
    cols["_twg_source_offset"] = pa.array(np.arange(50, 50 + n), pa.int64())
    cols["amount"] = pa.array(amount, pa.float64())
    cols["status"] = pa.array(status, pa.string())
    cols["order_id"] = pa.array(order_id, pa.int64())
    cols["customer"] = pa.array(customer, pa.string())
    if items is not None:
        cols["items"] = pa.array(items, pa.list_(pa.int64()))
    return pa.table(cols)


def chain(
    path: Path, mode: str = "quarantine", *, audit: bool = False, before: list[dict[str, Any]] = ()
) -> Chain:  # type: ignore[assignment]
    nodes = [
        *before,
        {
            "name": "dq",
            "from": before[-1]["name"] if before else "orders",
            "contract": str(path),
            "mode": mode,
        },
    ]
    if audit:
        nodes.append({"name": "dq_audit", "from": "dq", "audit": True})
    dag = Dag.of(PipelineConfig.model_validate({"nodes": nodes}))
    return Chain(dag, nodes[-1]["name"], COLS)


GOOD = batch([5, 7, 9, 11], ["new", "paid", "new", "paid"], [1, 2, 3, 4], ["a", "b", "c", "d"])
MIXED = batch(
    [5, -1, 9, 11], ["new", "paid", "lost", "paid"], [1, 2, 3, 3], ["a", None, None, None]
)


def test_quarantine_refuses_the_breaking_records_with_their_rules(tmp_path: Path) -> None:
    out = chain(contract(tmp_path)).apply(MIXED)
    assert out.rows.column("_twg_position").to_pylist() == [50, 53]
    by_reason = {r.reason: r for r in out.rejected}
    assert by_reason["contract"].positions.tolist() == [51]
    assert "amount = -1.0 is below the minimum 0" in by_reason["contract"].errors[0]
    assert by_reason["quality"].positions.tolist() == [52]
    assert "lost" in by_reason["quality"].errors[0]
    assert {r.node for r in out.rejected} == {"dq"}


def test_a_record_is_quarantined_whole_below_an_unnest(tmp_path: Path) -> None:
    lines = {
        "name": "lines",
        "from": "orders",
        "query": "select unnest(items) as amount, status, order_id, customer, _twg_* from input",
    }
    table = batch([1, 1], ["new", "new"], [1, 2], ["a", "b"], items=[[2, 3], [4, -5, 6]])
    out = chain(contract(tmp_path, dataset=False), before=[lines]).apply(table)
    assert out.rows.column("amount").to_pylist() == [2, 3]  # record 51 loses all 3 rows
    (refused,) = out.rejected
    assert refused.positions.tolist() == [51] and len(refused.errors) == 1


def test_annotate_lets_every_row_pass_with_its_verdict(tmp_path: Path) -> None:
    out = chain(contract(tmp_path), "annotate").apply(MIXED)
    assert out.rows.num_rows == 4 and out.rejected == ()
    verdicts = out.rows.column("_twg_dq_verdict").to_pylist()
    assert verdicts[0] is None and verdicts[3] is None
    assert verdicts[1].startswith("contract: amount = -1.0")
    assert verdicts[2].startswith("quality: ")


def test_strict_stops_at_a_broken_rule_naming_it_and_the_record(tmp_path: Path) -> None:
    strict = chain(contract(tmp_path), "strict")
    assert strict.apply(GOOD).rows.num_rows == 4  # nothing broken: everything passes
    with pytest.raises(ContractStopError, match=r"stopped at position 51: rule 'amount minimum"):
        strict.apply(MIXED)
    # A dataset rule alone stops it too: 3 of 4 customers null is over 50 %.
    nulls = batch([5, 7, 9, 11], ["new"] * 4, [1, 2, 3, 4], ["a", None, None, None])
    with pytest.raises(ContractStopError, match=r"dataset rule 'customer: nullValues' fail: 75"):
        strict.apply(nulls)


def test_the_audit_is_one_verdict_per_rule_and_batch_with_its_version(tmp_path: Path) -> None:
    path = contract(tmp_path)
    out = chain(path, audit=True).apply(MIXED)
    audit = {r["rule"]: r for r in out.rows.to_pylist()}
    assert audit["amount minimum"]["verdict"] == "fail" and audit["amount minimum"]["value"] == 1
    assert audit["order_id: duplicateValues"]["value"] == 1  # order 3 twice
    assert audit["customer: nullValues"]["value"] == 75.0
    assert audit["customer: nullValues"]["verdict"] == "fail"
    assert audit["some rows"]["verdict"] == "pass" and audit["some rows"]["value"] == 4
    assert audit["few big orders"]["verdict"] == "pass"
    row = audit["some rows"]
    assert row["scope"] == "dataset" and row["contract_id"] == "orders-contract"
    assert row["rule_version"].startswith("1.2.0#")
    assert (row["batch_rows"], row["batch_first_position"], row["batch_last_position"]) == (
        4,
        50,
        53,
    )
    assert row["_twg_position"] == 50 and row["_twg_source_partition"] == 3
    assert out.rows.column("_twg_derived_index").to_pylist() == list(range(out.rows.num_rows))
    # Another wording of the contract is another rule version; the same is the same.
    again = chain(path, audit=True).apply(MIXED).rows
    assert again.column("rule_version").to_pylist() == out.rows.column("rule_version").to_pylist()
    bumped = chain(contract(tmp_path, version="1.3.0"), audit=True).apply(MIXED).rows
    assert bumped.column("rule_version")[0].as_py().startswith("1.3.0#")
    assert chain(path, audit=True).apply(MIXED.slice(0, 0)).rows.num_rows == 0


def test_quality_and_audit_nodes_are_checked_with_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="an audit node reads a node with a contract"):
        PipelineConfig.model_validate({"nodes": [{"name": "a", "from": "orders", "audit": True}]})
    with pytest.raises(ValueError, match="give one of query, sidecar, contract or audit"):
        PipelineConfig.model_validate(
            {"nodes": [{"name": "a", "from": "orders", "query": "select 1", "contract": "x.yaml"}]}
        )
    with pytest.raises(ConfigError, match=r"pipeline\.nodes\.dq: contract .*missing\.yaml"):
        chain(tmp_path / "missing.yaml")


def test_config_validate_loads_each_quality_nodes_contract(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from thalweg.cli.main import cli

    cfg = tmp_path / "twg.toml"
    body = """
[[sources]]
name = "k"
kind = "kafka"
bootstrap_servers = "127.0.0.1:1"
topics = ["orders"]
format = "json"

[[pipeline.nodes]]
name = "dq"
from = "orders"
contract = "{contract}"
materialise = true
"""
    cfg.write_text(body.format(contract=tmp_path / "missing.yaml"))
    result = CliRunner().invoke(cli, ["config", "validate", str(cfg)], obj={})
    assert result.exit_code == 2 and "pipeline.nodes.dq: contract" in result.output
    cfg.write_text(body.format(contract=contract(tmp_path)))
    result = CliRunner().invoke(cli, ["config", "validate", str(cfg)], obj={})
    assert result.exit_code == 0, result.output
