"""A contract object's dataset-level rules, judged over one batch at a time.

The ingest path enforces what one record can decide (``checks``); a data-quality node of
the pipeline (``thalweg.pipeline.quality``) also judges what needs many records — over
each batch it is given (a raw segment's records): ``rowCount``, ``duplicateValues``,
``nullValues`` / ``missingValues`` / ``invalidValues`` with a threshold other than
``mustBe: 0`` (counts, or ``unit: percent``), and ``type: sql`` queries (DataFusion; the
object is the table ``record``, also spelled ``{object}`` or ``${object}``). Each gives a
number and passes or fails its threshold; a rule with no threshold is measured only.

A batch is a window, not the whole dataset: a duplicate across two batches is not seen,
and a row count is a batch's. That is what "evaluated as SQL over each batch" means, and
``docs/contracts.md`` says so.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from thalweg.codecs.base import DecodeReason
from thalweg.contracts.checks import (
    SQL_TABLE,
    RowCheck,
    RuleError,
    _missing_check,
    _null_check,
    _pattern_check,
    _valid_check,
    column,
)
from thalweg.contracts.model import Property, QualityRule, SchemaObject

# ODCS threshold keys (3.0 and 3.1 spellings) → the test of a measured value.
_TESTS: dict[str, Callable[[float, Any], bool]] = {
    "mustBe": lambda v, t: v == t,
    "mustNotBe": lambda v, t: v != t,
    "mustBeGreaterThan": lambda v, t: v > t,
    "mustBeGreaterOrEqualTo": lambda v, t: v >= t,
    "mustBeGreaterThanOrEqualTo": lambda v, t: v >= t,
    "mustBeLessThan": lambda v, t: v < t,
    "mustBeLessOrEqualTo": lambda v, t: v <= t,
    "mustBeLessThanOrEqualTo": lambda v, t: v <= t,
    "mustBeBetween": lambda v, t: t[0] <= v <= t[1],
    "mustNotBeBetween": lambda v, t: not t[0] <= v <= t[1],
}
_COUNTED = ("nullValues", "nullCheck", "missingValues", "invalidValues")


@dataclass(frozen=True)
class DatasetCheck:
    """One dataset-level rule: ``measure(table)`` → a number, judged by its thresholds."""

    label: str
    definition: str  # the rule as canonical JSON: what its version digests
    measure: Callable[[pa.Table], float]
    thresholds: dict[str, Any]

    def passes(self, value: float) -> bool:
        return all(_TESTS[k](value, t) for k, t in self.thresholds.items())

    @property
    def threshold_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.thresholds.items()))

    def digest(self) -> str:
        return hashlib.sha256(self.definition.encode()).hexdigest()[:12]


def compile_dataset(obj: SchemaObject) -> list[DatasetCheck]:
    """Every dataset-level rule of ``obj`` (per-record ones stay with ``checks``).

    Raises:
        RuleError: a threshold key ODCS does not define, or ``mustBeBetween`` without a
            pair.
    """
    out: list[DatasetCheck] = []
    for prop in obj.properties:
        _walk(prop, (prop.name,), out)
    for rule in obj.quality:
        check = _compile(None, rule)
        if check is not None:
            out.append(check)
    return out


def _walk(prop: Property, path: tuple[str, ...], out: list[DatasetCheck]) -> None:
    for rule in prop.quality:
        check = _compile(path, rule)
        if check is not None:
            out.append(check)
    for child in prop.properties:
        _walk(child, (*path, child.name), out)


def _compile(path: tuple[str, ...] | None, rule: QualityRule) -> DatasetCheck | None:
    metric = rule.metric or rule.rule
    thresholds = rule.thresholds()
    for key, value in thresholds.items():
        if key not in _TESTS:
            raise RuleError(f"{rule.label}: unknown threshold {key!r}")
        if key.endswith("Between") and (not isinstance(value, list) or len(value) != 2):
            raise RuleError(f"{rule.label}: {key} takes [low, high]")
    percent = str((rule.model_extra or {}).get("unit", "rows")).lower() == "percent"
    where = ".".join(path) if path is not None else None
    definition = json.dumps(
        {"path": where, **rule.model_dump(by_alias=True, exclude_none=True)},
        sort_keys=True,
        default=str,
    )
    label = f"{where}: {rule.label}" if where else rule.label
    measure: Callable[[pa.Table], float] | None = None
    if rule.type == "sql" and rule.query:
        measure = _sql_measure(rule.query)
    elif rule.type == "library" and metric == "rowCount":
        measure = _row_count
    elif rule.type == "library" and metric == "duplicateValues":
        props = [p.split(".") for p in rule.arguments.get("properties", [])]
        paths = [tuple(p) for p in props] or ([path] if path is not None else [])
        if paths:
            measure = _duplicates(paths, percent)
    elif (
        rule.type == "library"
        and metric in _COUNTED
        and path is not None
        and thresholds not in ({}, {"mustBe": 0})
    ):
        row = _row_check(path, rule, metric)
        if row is not None:
            measure = _counted(row, percent)
    if measure is None:
        return None
    return DatasetCheck(label, definition, measure, thresholds)


def _row_check(path: tuple[str, ...], rule: QualityRule, metric: str | None) -> RowCheck | None:
    args = rule.arguments
    if metric in ("nullValues", "nullCheck"):
        return _null_check(path, rule.label)
    if metric == "missingValues" and "missingValues" in args:
        return _missing_check(path, rule.label, list(args["missingValues"]))
    if metric == "invalidValues" and "validValues" in args:
        return _valid_check(path, rule.label, list(args["validValues"]))
    if metric == "invalidValues" and "pattern" in args:
        return _pattern_check(path, str(args["pattern"]), DecodeReason.QUALITY)
    return None


def _row_count(table: pa.Table) -> float:
    return float(table.num_rows)


def _counted(row: RowCheck, percent: bool) -> Callable[[pa.Table], float]:
    def measure(table: pa.Table) -> float:
        bad = float(np.count_nonzero(row.bad(table)))
        return 100.0 * bad / table.num_rows if percent and table.num_rows else bad

    return measure


def _duplicates(paths: list[tuple[str, ...]], percent: bool) -> Callable[[pa.Table], float]:
    """Rows whose value (or combination of values) an earlier row of the batch has;
    rows with a null among them are not counted."""

    def measure(table: pa.Table) -> float:
        cols = [column(table, p) for p in paths]
        if any(c is None for c in cols):
            return 0.0
        keyed = pa.table({f"k{i}": c for i, c in enumerate(cols)}).drop_null()
        distinct = keyed.group_by(keyed.column_names).aggregate([]).num_rows
        dups = float(keyed.num_rows - distinct)
        return 100.0 * dups / table.num_rows if percent and table.num_rows else dups

    return measure


def _sql_measure(query: str) -> Callable[[pa.Table], float]:
    """One number from a query over the batch (the first column of the first row;
    no row or null counts as 0)."""
    from datafusion import SessionConfig, SessionContext

    text = query.replace("${object}", SQL_TABLE).replace("{object}", SQL_TABLE)

    def measure(table: pa.Table) -> float:
        ctx = SessionContext(SessionConfig().with_target_partitions(1))
        batches = table.to_batches() or [pa.RecordBatch.from_pylist([], schema=table.schema)]
        ctx.register_record_batches(SQL_TABLE, [batches])
        try:
            result = ctx.sql(text).to_arrow_table()
        except Exception as exc:  # DataFusion raises plain Exception
            raise RuleError(str(exc).strip().splitlines()[0]) from exc
        if result.num_columns == 0 or result.num_rows == 0:
            return 0.0
        value = result.column(0)[0].as_py()
        if value is None:
            return 0.0
        if not isinstance(value, int | float):
            raise RuleError(f"the query gives {result.schema.field(0).type}, not a number")
        return float(value)

    return measure
