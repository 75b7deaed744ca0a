"""Arrow ↔ Iceberg for the Iceberg sink: the Arrow types Iceberg lacks mapped to the
nearest it has, the widenings a table may take, and ``partition_by``'s transforms."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)

_UNSIGNED = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.int64(),
}


def parse_transform(text: str) -> tuple[Transform[Any, Any], str]:
    """``day(col)`` → (DayTransform(), "col"); ``bucket(16, c)`` → (BucketTransform(16), "c")."""
    name, _, rest = text.strip().partition("(")
    args = [a.strip() for a in rest.rstrip(")").split(",")]
    simple: dict[str, Transform[Any, Any]] = {
        "day": DayTransform(),
        "hour": HourTransform(),
        "month": MonthTransform(),
        "year": YearTransform(),
        "identity": IdentityTransform(),
    }
    if name in simple:
        return simple[name], args[0]
    if name == "bucket":
        return BucketTransform(int(args[0])), args[1]
    return TruncateTransform(int(args[0])), args[1]


def iceberg_types(table: pa.Table) -> pa.Table:
    """Cast columns whose Arrow type Iceberg lacks to the nearest type it has."""
    fields = []
    for f in table.schema:
        t = f.type
        if pa.types.is_timestamp(t) and t.unit in ("s", "ms"):
            t = pa.timestamp("us", tz=t.tz)
        elif t in _UNSIGNED:
            t = _UNSIGNED[t]
        fields.append(f.with_type(t))
    schema = pa.schema(fields)
    return table if schema == table.schema else table.cast(schema)


def same_types(current: pa.Schema, incoming: pa.Schema) -> bool:
    """Every incoming column has the table's type already (a large string or binary
    takes its small form): no schema update is needed."""
    for f in incoming:
        have = current.field(f.name).type
        if (
            have != f.type
            and not (pa.types.is_large_string(have) and pa.types.is_string(f.type))
            and not (pa.types.is_large_binary(have) and pa.types.is_binary(f.type))
        ):
            return False
    return True
