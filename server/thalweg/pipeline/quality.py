"""Data quality in the DAG: a node that enforces an ODCS contract, and its audit.

A quality node (``contract = "orders.yaml"``) judges each batch it is given against the
contract object of its topic: the per-record rules (``thalweg.contracts.checks`` — the
same vectorised masks the ingest path runs) and the dataset-level ones over the batch
(``thalweg.contracts.dataset``). What it does with a broken rule is its ``mode`` (ADR
0014 in the seed plan):

* ``quarantine`` — records breaking a per-record rule are refused (the chain writes them
  to the node's dead-letter lane with reason ``contract`` or ``quality``); the rest pass.
* ``annotate`` — every row passes, with ``<prefix>dq_verdict``: null when the record
  keeps every per-record rule, else the first rule it breaks and why.
* ``strict`` — any broken rule, per record or over the batch, stops the node: it raises
  :class:`ContractStopError` naming the rule and the first record, so its sinks go
  ``degraded`` and nothing below it moves on — nothing is skipped — until the contract
  or the data is fixed.

Each batch also gives one verdict row per rule (:func:`verdict_schema`): the rule, its
version (the contract's version and a digest of the rule's text, so a verdict says
which wording judged it), pass or fail, the measured value and the threshold. An audit
node (``audit = true``, reading the quality node) is those rows; it can have a sink.
A verdict row carries the locators of its batch's first record, and the chain gives
each rule its own ``_twg_derived_index``, so a replay of the batch lands the same rows
once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from thalweg.config.pipeline import NodeConfig
from thalweg.contracts.checks import CompiledContract, RuleError, compile_object
from thalweg.contracts.dataset import DatasetCheck, compile_dataset
from thalweg.contracts.model import DataContract, load_contract
from thalweg.errors import ConfigError, InvariantError, ThalwegError
from thalweg.records.columns import MetadataColumns

VERDICT = "dq_verdict"


class ContractStopError(ThalwegError):
    """A strict quality node met a broken rule: it stops, nothing below it moves on."""


def verdict_schema(columns: MetadataColumns) -> pa.Schema:
    """One row per rule and batch (an audit node's rows), with the batch's first
    record's locators."""
    return pa.schema(
        [
            pa.field("node", pa.string()),
            pa.field("contract_id", pa.string()),
            pa.field("rule", pa.string()),
            pa.field("rule_version", pa.string()),
            pa.field("scope", pa.string()),  # record | dataset
            pa.field("reason", pa.string()),  # contract | quality
            pa.field("verdict", pa.string()),  # pass | fail | error
            pa.field("value", pa.float64()),  # rows breaking it, or the measured value
            pa.field("threshold", pa.string()),
            pa.field("detail", pa.string()),  # why it could not be judged, or an example
            pa.field("batch_rows", pa.int64()),
            pa.field("batch_first_position", pa.int64()),
            pa.field("batch_last_position", pa.int64()),
            *columns.locator_fields,
        ]
    )


@dataclass(frozen=True, slots=True)
class Judged:
    """A quality node's answer for one batch."""

    rows: pa.Table
    refused: list[tuple[str, np.ndarray, list[str]]]  # (reason, positions, errors)
    verdicts: pa.Table


class QualityNode:
    """One quality node, its contract compiled for its topic.

    Raises:
        ConfigError: the contract does not load, has no object for the topic, or has a
            rule that cannot be compiled — naming the node.
    """

    def __init__(self, cfg: NodeConfig, topic: str, columns: MetadataColumns) -> None:
        if cfg.contract is None:
            raise InvariantError("cfg.contract is not set")
        where = f"pipeline.nodes.{cfg.name}"
        self.name = cfg.name
        self.mode = cfg.mode
        self.columns = columns
        try:
            contract: DataContract = load_contract(Path(cfg.contract))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        obj = contract.object_for(topic)
        if obj is None:
            raise ConfigError(f"{where}: {cfg.contract} has no schema object for topic {topic!r}")
        try:
            self.dataset: list[DatasetCheck] = compile_dataset(obj)
        except RuleError as exc:
            raise ConfigError(f"{where}: {cfg.contract}: {exc}") from exc
        self.records: CompiledContract = compile_object(obj)
        self.contract_id = contract.id or obj.name
        self._version = contract.version or "unversioned"

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        if self.mode == "annotate":
            return schema.append(pa.field(self.columns.prefix + VERDICT, pa.string()))
        return schema

    def _version_of(self, text: str) -> str:
        return f"{self._version}#{hashlib.sha256(text.encode()).hexdigest()[:12]}"

    def judge(self, table: pa.Table) -> Judged:
        """The batch judged: the rows that go on, the records refused (quarantine), the
        verdicts.

        Raises:
            ContractStopError: a strict node met a broken rule.
        """
        n = table.num_rows
        positions = table.column(self.columns.position).to_numpy()
        first = np.full(n, -1, np.int64)  # per row, the first check it breaks
        messages: list[str | None] = []
        verdicts: list[dict[str, object]] = []
        for i, (check, bad, cannot) in enumerate(self.records.judge(table)):
            hit = np.flatnonzero(bad)
            fresh = hit[first[hit] < 0]
            first[fresh] = i
            example = cannot or (check.explain(table, int(hit[0])) if len(hit) else None)
            messages.append(example if cannot else None)
            verdicts.append(
                {
                    "rule": check.label,
                    "rule_version": self._version_of(f"{check.reason}:{check.label}"),
                    "scope": "record",
                    "reason": check.reason.value,
                    "verdict": "error" if cannot else ("fail" if len(hit) else "pass"),
                    "value": float(len(hit)),
                    "threshold": "mustBe 0",
                    "detail": example,
                }
            )
        for d in self.dataset:
            value: float | None = None
            detail: str | None
            try:
                measured = d.measure(table)
            except RuleError as exc:
                verdict, detail = "error", f"cannot be evaluated: {exc}"
            else:
                value = measured
                verdict = "pass" if d.passes(measured) else "fail"
                detail = None if verdict == "pass" else f"{measured:g} breaks {d.threshold_text}"
            verdicts.append(
                {
                    "rule": d.label,
                    "rule_version": self._version_of(d.definition),
                    "scope": "dataset",
                    "reason": "quality",
                    "verdict": verdict,
                    "value": value,
                    "threshold": d.threshold_text or None,
                    "detail": detail,
                }
            )
        broken = np.flatnonzero(first >= 0)
        if self.mode == "strict":
            self._stop_if_broken(table, positions, first, broken, verdicts)
        checks = self.records.checks
        errors = [messages[first[r]] or checks[first[r]].explain(table, int(r)) for r in broken]
        refused: list[tuple[str, np.ndarray, list[str]]] = []
        rows = table
        if self.mode == "quarantine" and len(broken):
            # A record is refused whole: below an unnest one broken row sends all its rows.
            bad_positions = np.unique(positions[broken])
            keep = ~np.isin(positions, bad_positions)
            rows = table.filter(pa.array(keep))
            for reason in {checks[first[r]].reason.value for r in broken}:
                mine = [k for k, r in enumerate(broken) if checks[first[r]].reason.value == reason]
                pos = positions[broken[mine]]
                _, once = np.unique(pos, return_index=True)
                refused.append((reason, pos[once], [f"{errors[mine[k]]}" for k in once]))
        elif self.mode == "annotate":
            text = np.full(n, None, dtype=object)
            for k, r in enumerate(broken):
                text[r] = f"{checks[first[r]].reason.value}: {errors[k]}"
            rows = table.append_column(self.columns.prefix + VERDICT, pa.array(text, pa.string()))
        return Judged(rows, refused, self._verdict_table(table, positions, verdicts))

    def _stop_if_broken(
        self,
        table: pa.Table,
        positions: np.ndarray,
        first: np.ndarray,
        broken: np.ndarray,
        verdicts: list[dict[str, object]],
    ) -> None:
        where = f"pipeline.nodes.{self.name} (strict)"
        if len(broken):
            row = int(broken[0])
            check = self.records.checks[int(first[row])]
            raise ContractStopError(
                f"{where}: stopped at position {int(positions[row])}: rule "
                f"{check.label!r} broken ({check.explain(table, row)}); "
                f"{len(broken)} of {table.num_rows} rows in the batch break a rule"
            )
        for v in verdicts:
            if v["scope"] == "dataset" and v["verdict"] != "pass":
                raise ContractStopError(
                    f"{where}: stopped at the batch from position {int(positions[0])}: "
                    f"dataset rule {v['rule']!r} {v['verdict']}: {v['detail']}"
                )

    def _verdict_table(
        self, table: pa.Table, positions: np.ndarray, verdicts: list[dict[str, object]]
    ) -> pa.Table:
        schema = verdict_schema(self.columns)
        if table.num_rows == 0 or not verdicts:
            return schema.empty_table()
        k = len(verdicts)
        at = int(np.argmin(positions))
        cols: dict[str, object] = {
            name: [v[name] for v in verdicts]
            for name in ("rule", "rule_version", "scope", "reason", "verdict", "value")
        }
        cols["threshold"] = [v["threshold"] for v in verdicts]
        cols["detail"] = [v["detail"] for v in verdicts]
        cols["node"] = [self.name] * k
        cols["contract_id"] = [self.contract_id] * k
        cols["batch_rows"] = [table.num_rows] * k
        cols["batch_first_position"] = [int(positions.min())] * k
        cols["batch_last_position"] = [int(positions.max())] * k
        arrays = []
        for field in schema:
            if field.name in cols:
                arrays.append(pa.array(cols[field.name], field.type))
            elif field.name in table.column_names:
                value = table.column(field.name)[at]
                arrays.append(pa.array([value.as_py()] * k, field.type))
            else:
                arrays.append(pa.nulls(k, field.type))
        return pa.Table.from_arrays(arrays, schema=schema)
