"""The one authority for payload types → Arrow types (``docs/type-mapping.md``).

Every decode path of a format (the native columnar path and the per-record fallback)
conforms its output to the schema this module derives, so the two paths cannot disagree.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

AvroSchema = Any  # parsed JSON: str | dict | list


class UnsupportedSchemaError(ValueError):
    """The schema uses something the type map does not cover."""


_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}


def _logical(schema: dict[str, Any]) -> pa.DataType | None:
    lt = schema.get("logicalType")
    base = schema.get("type")
    if lt == "decimal" and base in ("bytes", "fixed"):
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        return (
            pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
        )
    table = {
        ("date", "int"): pa.date32(),
        ("time-millis", "int"): pa.time32("ms"),
        ("time-micros", "long"): pa.time64("us"),
        ("timestamp-millis", "long"): pa.timestamp("ms", tz="UTC"),
        ("timestamp-micros", "long"): pa.timestamp("us", tz="UTC"),
        ("local-timestamp-millis", "long"): pa.timestamp("ms"),
        ("local-timestamp-micros", "long"): pa.timestamp("us"),
        ("uuid", "string"): pa.string(),
        ("duration", "fixed"): pa.binary(12),
    }
    return table.get((lt, base)) if isinstance(lt, str) and isinstance(base, str) else None


def avro_to_arrow(schema: AvroSchema, named: dict[str, pa.DataType] | None = None) -> pa.DataType:
    """The Arrow type of an Avro schema.

    ``["null", T]`` (either order) is a nullable ``T``; any other union a dense union of
    its branches, in order. Enums are strings, maps ``map<string, T>``, fixed
    ``fixed_size_binary``. Unknown logical types fall back to their base type, as the
    Avro specification requires.
    """
    named = {} if named is None else named
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        if schema in named:
            return named[schema]
        raise UnsupportedSchemaError(f"unknown Avro type {schema!r}")
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) == 1:
            return avro_to_arrow(branches[0], named)
        if not branches:
            return pa.null()
        fields = [pa.field(f"b{i}", avro_to_arrow(b, named)) for i, b in enumerate(schema)]
        return pa.dense_union(fields, type_codes=list(range(len(fields))))
    t = schema.get("type")
    logical = _logical(schema)
    if logical is not None:
        return logical
    if t == "record":
        out = pa.struct(
            [
                pa.field(f["name"], avro_to_arrow(f["type"], named), nullable=_nullable(f["type"]))
                for f in schema["fields"]
            ]
        )
        named[schema["name"]] = out
        if "namespace" in schema:
            named[f"{schema['namespace']}.{schema['name']}"] = out
        return out
    if t == "enum":
        named[schema["name"]] = pa.string()
        return pa.string()
    if t == "fixed":
        out = pa.binary(int(schema["size"]))
        named[schema["name"]] = out
        return out
    if t == "array":
        return pa.list_(avro_to_arrow(schema["items"], named))
    if t == "map":
        return pa.map_(pa.string(), avro_to_arrow(schema["values"], named))
    if isinstance(t, str | list | dict):
        return avro_to_arrow(t, named)
    raise UnsupportedSchemaError(f"unsupported Avro schema {schema!r}")


def _nullable(schema: AvroSchema) -> bool:
    return schema == "null" or (isinstance(schema, list) and "null" in schema)


def avro_record_schema(schema: AvroSchema) -> pa.Schema:
    """The lane schema of a top-level Avro record: one column per field."""
    t = avro_to_arrow(schema)
    if not pa.types.is_struct(t):
        raise UnsupportedSchemaError("the top-level Avro schema must be a record")
    # Top-level columns are nullable in the lane: a tombstone or a failed row is all-null.
    return pa.schema([f.with_nullable(True) for f in t])
