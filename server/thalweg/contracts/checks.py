"""A contract object compiled into vectorised row checks.

Each check turns a decoded table into one boolean mask ("this row breaks the rule") with
``pyarrow.compute`` or one DataFusion expression — never a Python loop over good rows
(PERFORMANCE-NOTES: per-record Python work is where ingest time goes). Python only runs
for the rows that fail, to write their message.

Two kinds, two dead-letter reasons: ``contract`` for what the schema promises (required,
logical type, ``logicalTypeOptions`` bounds), ``quality`` for the ``quality`` rules that
can be judged one record at a time. Rules that need the whole dataset (duplicates, row
counts, SQL aggregates, percentage thresholds) are listed in ``unenforced``.

Why one module of ~450 lines: one compiler from an ODCS object to masks, one small
function per rule kind, read as the table of what is enforced and what is not.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.codecs.base import DecodeFailure, DecodeReason
from thalweg.contracts.model import Property, QualityRule, SchemaObject
from thalweg.errors import ThalwegError

log = logging.getLogger(__name__)

Mask = npt.NDArray[np.bool_]
Column: TypeAlias = Any  # pa.Array | pa.ChunkedArray (pyarrow ships no type hints)

# The table name a custom SQL expression sees: ``... FROM record``.
SQL_TABLE = "record"
SQL_ROW = "__twg_row_index"  # carries each row's place through the query
SQL_ENGINES = ("datafusion", "thalweg")

_TYPE_TESTS: dict[str, Callable[[pa.DataType], bool]] = {
    "string": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    "integer": pa.types.is_integer,
    "number": lambda t: pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t),
    "boolean": pa.types.is_boolean,
    "date": pa.types.is_date,
    "timestamp": pa.types.is_timestamp,
    "time": pa.types.is_time,
    "object": lambda t: pa.types.is_struct(t) or pa.types.is_map(t),
    "array": lambda t: (
        pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    ),
}
# Temporal values often travel as ISO 8601 text (JSON has no date type): accepted when
# they parse, and compared as the type they name.
_TEMPORAL: dict[str, tuple[pa.DataType, Callable[[str], Any]]] = {
    "date": (pa.date32(), dt.date.fromisoformat),
    "timestamp": (pa.timestamp("us", "UTC"), dt.datetime.fromisoformat),
    "time": (pa.time64("us"), dt.time.fromisoformat),
}
_BOUNDS: dict[str, tuple[Callable[..., Any], str]] = {
    "minimum": (pc.less, "is below the minimum"),
    "maximum": (pc.greater, "is above the maximum"),
    "exclusiveMinimum": (pc.less_equal, "is not above the exclusive minimum"),
    "exclusiveMaximum": (pc.greater_equal, "is not below the exclusive maximum"),
}


class RuleError(ThalwegError):
    """A rule that cannot be judged on this batch (an expression that does not plan, a
    bound of another type than the column)."""


@dataclass(frozen=True)
class RowCheck:
    """One rule: ``bad(table)`` marks breaking rows; ``explain(table, row)`` says why."""

    reason: DecodeReason
    label: str
    bad: Callable[[pa.Table], Mask]
    explain: Callable[[pa.Table, int], str]


@dataclass
class CompiledContract:
    """The checks of one contract object, in order: contract checks first, then quality.

    A row reports the first rule it breaks.
    """

    checks: list[RowCheck] = field(default_factory=list)
    unenforced: list[str] = field(default_factory=list)
    _logged: set[str] = field(default_factory=set)

    def evaluate(self, table: pa.Table, eligible: Mask) -> list[DecodeFailure]:
        """The failures among the ``eligible`` rows (decoded, not tombstones).

        A rule that cannot be judged refuses every row still eligible, with the reason,
        logged once: the records wait in the dead-letter lane for a fixed contract (or
        data) rather than pass a rule nobody checked.
        """
        remaining = eligible.copy()
        failures: list[DecodeFailure] = []
        for check in self.checks:
            if not remaining.any():
                break
            try:
                hit = check.bad(table) & remaining
                explain = check.explain
            except (RuleError, pa.ArrowException, ValueError, TypeError) as exc:
                message = f"{check.label}: cannot be evaluated: {exc}"
                if message not in self._logged:
                    self._logged.add(message)
                    log.error("contract rule %s", message)
                hit = remaining.copy()

                def explain(_t: pa.Table, _r: int, m: str = message) -> str:
                    return m

            for row in np.flatnonzero(hit):
                failures.append(DecodeFailure(int(row), check.reason, explain(table, int(row))))
            remaining &= ~hit
        return failures

    def judge(self, table: pa.Table) -> list[tuple[RowCheck, Mask, str | None]]:
        """Every check over every row — not only the first a row breaks — for a
        pipeline's quality node, which reports each rule's count: (check, rows breaking
        it, None) or, for a rule that cannot be judged, (check, every row, why)."""
        out: list[tuple[RowCheck, Mask, str | None]] = []
        for check in self.checks:
            try:
                out.append((check, check.bad(table), None))
            except (RuleError, pa.ArrowException, ValueError, TypeError) as exc:
                message = f"{check.label}: cannot be evaluated: {exc}"
                out.append((check, np.ones(len(table), np.bool_), message))
        return out


def compile_object(obj: SchemaObject) -> CompiledContract:
    """Every row check the object implies, and what it asks that is not checked here."""
    out = CompiledContract()
    quality: list[tuple[tuple[str, ...] | None, QualityRule]] = []
    for prop in obj.properties:
        _compile_property(prop, (prop.name,), out, quality)
    quality += [(None, rule) for rule in obj.quality]
    for path, rule in quality:
        _compile_quality(path, rule, out)
    return out


def _compile_property(
    prop: Property,
    path: tuple[str, ...],
    out: CompiledContract,
    quality: list[tuple[tuple[str, ...] | None, QualityRule]],
) -> None:
    name = ".".join(path)
    if prop.required:
        out.checks.append(_required_check(path))
    logical = prop.logical_type
    if logical is not None:
        out.checks.append(_type_check(path, logical))
    opts = prop.logical_type_options
    for key, (op, words) in _BOUNDS.items():
        if key in opts:
            out.checks.append(_bound_check(path, logical, key, opts[key], op, words))
    if "minLength" in opts or "maxLength" in opts:
        out.checks.append(_length_check(path, opts.get("minLength"), opts.get("maxLength")))
    if "pattern" in opts:
        out.checks.append(_pattern_check(path, str(opts["pattern"]), DecodeReason.CONTRACT))
    for key in sorted(set(opts) - {*_BOUNDS, "minLength", "maxLength", "pattern"}):
        out.unenforced.append(f"{name}: logicalTypeOptions.{key}")
    quality += [(path, rule) for rule in prop.quality]
    for child in prop.properties:
        _compile_property(child, (*path, child.name), out, quality)


def _compile_quality(
    path: tuple[str, ...] | None, rule: QualityRule, out: CompiledContract
) -> None:
    where = ".".join(path) if path is not None else "object"
    if rule.type == "text":
        return  # prose for people: nothing to run
    per_record = rule.thresholds() in ({}, {"mustBe": 0})
    if rule.type == "custom" and (rule.engine or "").lower() in SQL_ENGINES:
        out.checks.append(_sql_check(rule.label, str(rule.implementation)))
        return
    metric = rule.metric or rule.rule
    if rule.type == "library" and per_record and path is not None:
        args = rule.arguments
        if metric in ("nullValues", "nullCheck"):
            out.checks.append(_null_check(path, rule.label))
            return
        if metric == "missingValues" and "missingValues" in args:
            out.checks.append(_missing_check(path, rule.label, list(args["missingValues"])))
            return
        if metric == "invalidValues" and "validValues" in args:
            out.checks.append(_valid_check(path, rule.label, list(args["validValues"])))
            return
        if metric == "invalidValues" and "pattern" in args:
            out.checks.append(_pattern_check(path, str(args["pattern"]), DecodeReason.QUALITY))
            return
    out.unenforced.append(
        f"{where}: quality rule {rule.label!r} ({rule.type}"
        f"{', ' + metric if metric else ''}) needs the whole dataset, not one record"
    )


def column(table: pa.Table, path: Sequence[str]) -> Column | None:
    """The column at a dotted path through structs, or None where it does not exist."""
    if path[0] not in table.column_names:
        return None
    col: Column = table.column(path[0])
    for name in path[1:]:
        kind = col.type
        if not pa.types.is_struct(kind) or kind.get_field_index(name) < 0:
            return None
        col = pc.struct_field(col, name)
    return col


def _mask(arr: Column, n: int) -> Mask:
    """A boolean compute result as a numpy mask; null counts as "not broken"."""
    if isinstance(arr, pa.Scalar):
        return np.full(n, bool(arr.as_py()), np.bool_)
    filled = pc.fill_null(arr, False)
    if isinstance(filled, pa.ChunkedArray):
        filled = filled.combine_chunks()
    return np.asarray(filled.to_numpy(zero_copy_only=False), np.bool_)


def _value(table: pa.Table, path: Sequence[str], row: int) -> Any:
    col = column(table, path)
    return None if col is None else col[row].as_py()


def _as_logical(col: Column, logical: str | None) -> tuple[Column, Mask | None]:
    """``col`` in the type ``logical`` names, for text holding ISO temporal values: the
    converted column (null where unparseable) and the mask of unparseable rows."""
    if logical not in _TEMPORAL or not _TYPE_TESTS["string"](col.type):
        return col, None
    target, parse = _TEMPORAL[logical]
    try:
        return pc.cast(col, target), np.zeros(len(col), np.bool_)
    except pa.ArrowException:  # some value is not ISO text Arrow reads: parse one by one
        return _parse_each(col, target, parse)


def _parse_each(
    col: Column, target: pa.DataType, parse: Callable[[str], Any]
) -> tuple[Column, Mask]:
    """The slow path of :func:`_as_logical`, taken only when a value is off."""
    values: list[Any] = []
    bad = np.zeros(len(col), np.bool_)
    for i, text in enumerate(col.to_pylist()):
        try:
            value = None if text is None else parse(text)
        except ValueError:
            value = None
            bad[i] = True
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)  # ISO text without an offset: UTC
        values.append(value)
    return pa.array(values, target), bad


def _required_check(path: tuple[str, ...]) -> RowCheck:
    name = ".".join(path)

    def bad(table: pa.Table) -> Mask:
        col = column(table, path)
        if col is None:  # not decoded at all: absent from every record so far
            return np.ones(len(table), np.bool_)
        return _mask(pc.is_null(col), len(table))

    return RowCheck(
        DecodeReason.CONTRACT, f"{name} required", bad, lambda t, r: f"{name} is required"
    )


def _type_check(path: tuple[str, ...], logical: str) -> RowCheck:
    name = ".".join(path)
    test = _TYPE_TESTS[logical]

    def bad(table: pa.Table) -> Mask:
        col = column(table, path)
        if col is None:
            return np.zeros(len(table), np.bool_)
        if test(col.type):
            return np.zeros(len(table), np.bool_)
        _, unparsed = _as_logical(col, logical)
        if unparsed is not None:
            return unparsed
        return _mask(pc.is_valid(col), len(table))

    def explain(table: pa.Table, row: int) -> str:
        col = column(table, path)
        kind = col.type if col is not None else "absent"
        return f"{name} = {_value(table, path, row)!r} ({kind}) is not a {logical}"

    return RowCheck(DecodeReason.CONTRACT, f"{name} logicalType", bad, explain)


def _bound_check(
    path: tuple[str, ...],
    logical: str | None,
    key: str,
    limit: Any,
    op: Callable[..., Any],
    words: str,
) -> RowCheck:
    name = ".".join(path)

    def bad(table: pa.Table) -> Mask:
        col = column(table, path)
        if col is None:
            return np.zeros(len(table), np.bool_)
        values, _ = _as_logical(col, logical)
        bound: Any = limit
        if logical in _TEMPORAL:
            bound = pa.scalar(limit.isoformat() if hasattr(limit, "isoformat") else str(limit))
            bound = bound.cast(values.type)
        return _mask(op(values, bound), len(table))

    return RowCheck(
        DecodeReason.CONTRACT,
        f"{name} {key}",
        bad,
        lambda t, r: f"{name} = {_value(t, path, r)!r} {words} {limit!r}",
    )


def _length_check(path: tuple[str, ...], low: int | None, high: int | None) -> RowCheck:
    name = ".".join(path)

    def bad(table: pa.Table) -> Mask:
        col = column(table, path)
        if col is None or not _TYPE_TESTS["string"](col.type):
            return np.zeros(len(table), np.bool_)
        length = pc.utf8_length(col)
        out = np.zeros(len(table), np.bool_)
        if low is not None:
            out |= _mask(pc.less(length, int(low)), len(table))
        if high is not None:
            out |= _mask(pc.greater(length, int(high)), len(table))
        return out

    def explain(table: pa.Table, row: int) -> str:
        value = _value(table, path, row)
        return f"{name} has {len(value)} characters, outside [{low}, {high}]"

    return RowCheck(DecodeReason.CONTRACT, f"{name} length", bad, explain)


def _pattern_check(path: tuple[str, ...], pattern: str, reason: DecodeReason) -> RowCheck:
    name = ".".join(path)

    def bad(table: pa.Table) -> Mask:
        col = column(table, path)
        if col is None or not _TYPE_TESTS["string"](col.type):
            return np.zeros(len(table), np.bool_)
        return _mask(pc.invert(pc.match_substring_regex(col, pattern)), len(table))

    return RowCheck(
        reason,
        f"{name} pattern",
        bad,
        lambda t, r: f"{name} = {_value(t, path, r)!r} does not match {pattern!r}",
    )


def _null_check(path: tuple[str, ...], label: str) -> RowCheck:
    name = ".".join(path)

    def bad(table: pa.Table) -> Mask:
        col = column(table, path)
        if col is None:
            return np.ones(len(table), np.bool_)
        return _mask(pc.is_null(col), len(table))

    return RowCheck(DecodeReason.QUALITY, label, bad, lambda t, r: f"{label}: {name} is null")


def _missing_check(path: tuple[str, ...], label: str, missing: list[Any]) -> RowCheck:
    name = ".".join(path)
    values = [v for v in missing if v is not None]
    null_is_missing = len(values) < len(missing)

    def bad(table: pa.Table) -> Mask:
        col = column(table, path)
        if col is None:
            return np.full(len(table), null_is_missing, np.bool_)
        out = np.zeros(len(table), np.bool_)
        if values:
            out |= _mask(pc.is_in(col, value_set=pa.array(values).cast(col.type)), len(table))
        if null_is_missing:
            out |= _mask(pc.is_null(col), len(table))
        return out

    return RowCheck(
        DecodeReason.QUALITY,
        label,
        bad,
        lambda t, r: f"{label}: {name} = {_value(t, path, r)!r} counts as missing",
    )


def _valid_check(path: tuple[str, ...], label: str, valid: list[Any]) -> RowCheck:
    name = ".".join(path)

    def bad(table: pa.Table) -> Mask:
        col = column(table, path)
        if col is None:
            return np.zeros(len(table), np.bool_)
        inside = pc.is_in(col, value_set=pa.array(valid).cast(col.type))
        return _mask(pc.and_(pc.is_valid(col), pc.invert(inside)), len(table))

    return RowCheck(
        DecodeReason.QUALITY,
        label,
        bad,
        lambda t, r: f"{label}: {name} = {_value(t, path, r)!r} is not one of {valid!r}",
    )


def _sql_check(label: str, expression: str) -> RowCheck:
    """A DataFusion SQL boolean expression over the record's fields; a row breaks the
    rule when it is false (null passes, as in a SQL ``CHECK`` constraint). An expression
    that does not plan (a typo, a field not decoded yet) raises :class:`RuleError`.

    DataFusion runs a query over several partitions at once and does not keep row order,
    so each verdict travels with its row's index and is put back where it belongs.
    """
    from datafusion import SessionContext  # a heavy import, only for contracts that use it

    ctx = SessionContext()

    def bad(table: pa.Table) -> Mask:
        n = len(table)
        indexed = table.append_column(SQL_ROW, pa.array(np.arange(n, dtype=np.int64)))
        try:
            ctx.from_arrow(indexed, name=SQL_TABLE)
            try:
                result = ctx.sql(
                    f'SELECT "{SQL_ROW}", ({expression}) AS ok FROM {SQL_TABLE}'
                ).to_arrow_table()
            finally:
                ctx.deregister_table(SQL_TABLE)
        except Exception as exc:  # DataFusion raises plain Exception subclasses
            raise RuleError(str(exc).splitlines()[0]) from exc
        ok = result.column("ok")
        if not pa.types.is_boolean(ok.type):
            raise RuleError(f"the expression is {ok.type}, not boolean")
        out = np.zeros(n, np.bool_)
        rows = result.column(SQL_ROW).to_numpy()
        out[rows] = _mask(pc.invert(ok), len(result))
        return out

    return RowCheck(
        DecodeReason.QUALITY, label, bad, lambda t, r: f"{label}: {expression} is false"
    )
