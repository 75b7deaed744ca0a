"""What a query's plan says about the segments it needs, and whether it can be split.

After planning, each table scan carries the filters DataFusion pushed into it, split
into conjuncts. The ones on the partition, position and timestamp columns compared with
literals become a :class:`Selection`: the snapshot then links only the segments that
can hold matching rows, and skips the rest without opening them. Everything else is
ignored here — DataFusion still applies every filter to the rows, so a selection only
has to keep a superset of the matching rows, never exactly them.

A query that works row by row on one table (scans, filters, projections) gives the same
rows partition by partition; :func:`row_wise` tells the service so, and it answers with
one endpoint per partition that clients read in parallel.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import Any

from thalweg.flight.sql.metadata import DEFAULT_SCHEMA
from thalweg.records.columns import MetadataColumns

_ROW_WISE = {"Projection", "Filter", "TableScan", "SubqueryAlias"}
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}


@dataclass(frozen=True, slots=True)
class Selection:
    """Bounds a table's rows are known to lie in (None: unbounded). Positions and
    timestamps (epoch milliseconds) are inclusive bounds."""

    partitions: frozenset[int] | None = None
    position_lo: int | None = None
    position_hi: int | None = None
    ts_lo_ms: int | None = None
    ts_hi_ms: int | None = None

    def only(self, partitions: frozenset[int] | None) -> Selection:
        """This selection narrowed to ``partitions`` (an endpoint's share)."""
        if partitions is None:
            return self
        mine = partitions if self.partitions is None else self.partitions & partitions
        return replace(self, partitions=mine)

    def keeps_partition(self, p: int) -> bool:
        return self.partitions is None or p in self.partitions

    def keeps_positions(self, first: int, last: int) -> bool:
        lo, hi = self.position_lo, self.position_hi
        return (lo is None or last >= lo) and (hi is None or first <= hi)

    def keeps_times(self, min_ms: int | None, max_ms: int | None) -> bool:
        """Whether a segment whose timestamps span ``[min_ms, max_ms]`` (None: unknown)
        can hold a selected row."""
        if min_ms is None or max_ms is None:
            return True
        lo, hi = self.ts_lo_ms, self.ts_hi_ms
        return (lo is None or max_ms >= lo) and (hi is None or min_ms <= hi)


EVERYTHING = Selection()


def table_key(scan: Any) -> tuple[str, str]:
    """``(lane schema, topic)`` of a TableScan (the defaults filled in)."""
    _catalog, schema, table = scan.fqn()
    return (schema or DEFAULT_SCHEMA, table)


def scans(plan: Any) -> list[Any]:
    """Every TableScan of a logical plan."""
    out = []
    stack = [plan]
    while stack:
        node = stack.pop()
        variant = node.to_variant()
        if type(variant).__name__ == "TableScan":
            out.append(variant)
        stack.extend(node.inputs())
    return out


def row_wise(plan: Any) -> bool:
    """Whether the plan is scans, filters and projections of exactly one table scan."""
    count = 0
    stack = [plan]
    while stack:
        node = stack.pop()
        name = type(node.to_variant()).__name__
        if name not in _ROW_WISE:
            return False
        count += name == "TableScan"
        stack.extend(node.inputs())
    return count == 1


def selections(plan: Any, columns: MetadataColumns) -> dict[tuple[str, str], Selection]:
    """The selection of every table the plan scans. A table scanned more than once (a
    self-join, a union) gets no selection: its scans may want different rows."""
    found: dict[tuple[str, str], Selection] = {}
    seen: set[tuple[str, str]] = set()
    for scan in scans(plan):
        key = table_key(scan)
        if key in seen:
            found[key] = EVERYTHING
            continue
        seen.add(key)
        sel = EVERYTHING
        for conjunct in scan.filters():
            sel = _narrow(sel, conjunct, columns)
        found[key] = sel
    return found


def _narrow(sel: Selection, expr: Any, columns: MetadataColumns) -> Selection:
    partitions = _partition_set(expr, columns.partition)
    if partitions is not None:
        return sel.only(partitions)
    cmp = _comparison(expr)
    if cmp is None:
        return sel
    column, op, value = cmp
    if column == columns.partition and op == "=" and isinstance(value, int):
        return sel.only(frozenset([value]))
    if column == columns.position and isinstance(value, int):
        lo, hi = _bounds(op, value)
        return replace(
            sel,
            position_lo=_max(sel.position_lo, lo),
            position_hi=_min(sel.position_hi, hi),
        )
    if column == columns.timestamp:
        ms = _epoch_ms(value)
        if ms is not None:
            # Whole milliseconds around the literal, whatever its precision: never tighter.
            lo, hi = _bounds({">": ">=", "<": "<="}.get(op, op), ms)
            hi = None if hi is None else hi + 1
            return replace(sel, ts_lo_ms=_max(sel.ts_lo_ms, lo), ts_hi_ms=_min(sel.ts_hi_ms, hi))
    return sel


def _bounds(op: str, v: int) -> tuple[int | None, int | None]:
    """Inclusive bounds a comparison ``column op v`` puts on an integer column."""
    return {
        "=": (v, v),
        ">=": (v, None),
        ">": (v + 1, None),
        "<=": (None, v),
        "<": (None, v - 1),
    }.get(op, (None, None))


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _comparison(expr: Any) -> tuple[str, str, object] | None:
    """``(column, op, literal)`` of ``column op literal`` or ``literal op column``."""
    v = expr.to_variant()
    if type(v).__name__ != "BinaryExpr":
        return None
    op = str(v.op())
    if op not in _FLIP:
        return None
    left, right = v.left(), v.right()
    lname, rname = type(left.to_variant()).__name__, type(right.to_variant()).__name__
    if lname == "Column" and rname == "Literal":
        return left.to_variant().name(), op, _py(right.python_value())
    if lname == "Literal" and rname == "Column":
        return right.to_variant().name(), _FLIP[op], _py(left.python_value())
    return None


def _py(value: object) -> object:
    """A literal as a Python value (DataFusion hands some over as pyarrow scalars)."""
    as_py = getattr(value, "as_py", None)
    return as_py() if callable(as_py) else value


def _partition_set(expr: Any, partition: str) -> frozenset[int] | None:
    """The partitions of ``p = a OR p = b OR …`` (how IN lists arrive), else None."""
    v = expr.to_variant()
    if type(v).__name__ != "BinaryExpr" or str(v.op()) != "OR":
        return None
    left = _partition_set(v.left(), partition) or _equal_partition(v.left(), partition)
    right = _partition_set(v.right(), partition) or _equal_partition(v.right(), partition)
    return left | right if left is not None and right is not None else None


def _equal_partition(expr: Any, partition: str) -> frozenset[int] | None:
    cmp = _comparison(expr)
    if cmp is None or cmp[0] != partition or cmp[1] != "=" or not isinstance(cmp[2], int):
        return None
    return frozenset([cmp[2]])


def _epoch_ms(value: object) -> int | None:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp() * 1000)
    return None
