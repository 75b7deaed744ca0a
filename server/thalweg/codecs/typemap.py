"""The one authority for payload types → Arrow types (``docs/type-mapping.md``).

Every decode path of a format (the native columnar path and the per-record fallback)
conforms its output to the schema this module derives, so the two paths cannot disagree.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from thalweg.errors import ThalwegError

AvroSchema = Any  # parsed JSON: str | dict | list


class UnsupportedSchemaError(ThalwegError, ValueError):
    """The schema uses something the type map does not cover.

    Also a ``ValueError``: the decoders' schema loading catches ``ValueError`` for a bad
    schema file, and this is one.
    """


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

    ``["null", T]`` (either order) is a nullable ``T``; any other union a struct with one
    nullable field per non-null branch (named by :func:`branch_name`), exactly one set.
    Enums are strings, maps ``map<string, T>``, fixed ``fixed_size_binary``. Unknown
    logical types fall back to their base type, as the Avro specification requires.
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
        # Parquet has no union type, so the lane stores a general union the way spark-avro
        # does: a struct with one nullable field per non-null branch, exactly one set.
        return pa.struct([pa.field(branch_name(b), avro_to_arrow(b, named)) for b in branches])
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


def branch_name(schema: AvroSchema) -> str:
    """The field name of a union branch: the primitive or named type, else its kind."""
    if isinstance(schema, str):
        return schema.rsplit(".", 1)[-1]
    if isinstance(schema, dict):
        if "name" in schema:
            return str(schema["name"]).rsplit(".", 1)[-1]
        if "logicalType" in schema:
            return str(schema["logicalType"])
        return str(schema.get("type"))
    raise UnsupportedSchemaError(f"a union directly inside a union: {schema!r}")


def is_general_union(schema: AvroSchema) -> bool:
    """True for a union with more than one non-null branch."""
    return isinstance(schema, list) and len([b for b in schema if b != "null"]) > 1


def _nullable(schema: AvroSchema) -> bool:
    return schema == "null" or (isinstance(schema, list) and "null" in schema)


def avro_record_schema(schema: AvroSchema) -> pa.Schema:
    """The lane schema of a top-level Avro record: one column per field."""
    t = avro_to_arrow(schema)
    if not pa.types.is_struct(t):
        raise UnsupportedSchemaError("the top-level Avro schema must be a record")
    # Top-level columns are nullable in the lane: a tombstone or a failed row is all-null.
    # A field's ``doc`` goes with its column (``b"doc"``, the key pyiceberg reads): a
    # sink's table comments fall back to it (sinks/table_docs.py).
    fields = schema.get("fields", []) if isinstance(schema, dict) else []
    docs = {f["name"]: f["doc"] for f in fields if isinstance(f.get("doc"), str)}
    return pa.schema(
        [
            f.with_nullable(True).with_metadata({b"doc": docs[f.name].encode()})
            if f.name in docs
            else f.with_nullable(True)
            for f in t
        ]
    )


def arrow_to_avro(t: pa.DataType, name: str, nullable: bool = True) -> AvroSchema:
    """The Avro schema that :func:`avro_to_arrow` maps back to ``t`` (for encoding).

    Nullable Arrow fields become ``["null", T]`` with a null default.
    """
    if pa.types.is_struct(t):
        inner: AvroSchema = {
            "type": "record",
            "name": name,
            "fields": [
                _avro_field(t.field(i), f"{name}_{t.field(i).name}") for i in range(t.num_fields)
            ],
        }
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = {
            "type": "array",
            "items": arrow_to_avro(t.value_type, f"{name}_item", t.value_field.nullable),
        }
    elif pa.types.is_map(t):
        if t.key_type != pa.string():
            raise UnsupportedSchemaError("Avro maps need string keys")
        inner = {
            "type": "map",
            "values": arrow_to_avro(t.item_type, f"{name}_value", t.item_field.nullable),
        }
    elif pa.types.is_decimal(t):
        inner = {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": t.precision,
            "scale": t.scale,
        }
    elif pa.types.is_timestamp(t):
        unit = {"ms": "millis", "us": "micros"}.get(t.unit)
        if unit is None:
            raise UnsupportedSchemaError(f"Avro has no timestamp in {t.unit}")
        prefix = "timestamp" if t.tz is not None else "local-timestamp"
        inner = {"type": "long", "logicalType": f"{prefix}-{unit}"}
    elif pa.types.is_date32(t):
        inner = {"type": "int", "logicalType": "date"}
    elif pa.types.is_time32(t):
        inner = {"type": "int", "logicalType": "time-millis"}
    elif pa.types.is_time64(t):
        inner = {"type": "long", "logicalType": "time-micros"}
    elif pa.types.is_fixed_size_binary(t):
        inner = {"type": "fixed", "name": name, "size": t.byte_width}
    else:
        simple = {
            pa.bool_(): "boolean",
            pa.int8(): "int",
            pa.int16(): "int",
            pa.int32(): "int",
            pa.uint8(): "int",
            pa.uint16(): "int",
            pa.int64(): "long",
            pa.uint32(): "long",
            pa.float16(): "float",
            pa.float32(): "float",
            pa.float64(): "double",
            pa.string(): "string",
            pa.large_string(): "string",
            pa.binary(): "bytes",
            pa.large_binary(): "bytes",
            pa.null(): "null",
        }
        if t not in simple:
            raise UnsupportedSchemaError(f"no Avro type for Arrow {t}")
        inner = simple[t]
    if nullable and inner != "null":
        return ["null", inner]
    return inner


def _avro_field(f: pa.Field, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"name": f.name, "type": arrow_to_avro(f.type, name, f.nullable)}
    if f.nullable:
        out["default"] = None
    return out


def arrow_schema_to_avro(schema: pa.Schema, name: str) -> AvroSchema:
    """A top-level Avro record for rows of ``schema`` (``name`` must be an Avro name)."""
    return {
        "type": "record",
        "name": name,
        "fields": [_avro_field(f, f"{name}_{f.name}") for f in schema],
    }


def json_schema_to_arrow(schema: dict[str, Any]) -> pa.DataType:
    """The Arrow type of a JSON Schema (draft 7 subset: type, properties, items, format).

    ``{"type": ["string", "null"]}`` is a nullable string; ``format: date-time`` a
    ``timestamp[us, UTC]``, ``format: date`` a ``date32``; ``integer`` is ``int64``,
    ``number`` ``float64``. Objects without ``properties`` and ``oneOf``/``anyOf`` are
    not covered.
    """
    t = schema.get("type")
    types = [x for x in (t if isinstance(t, list) else [t]) if x != "null"]
    if len(types) != 1:
        raise UnsupportedSchemaError(f"JSON Schema type {t!r} is not a single type")
    kind = types[0]
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, dict):
            raise UnsupportedSchemaError("JSON Schema objects need 'properties'")
        return pa.struct([pa.field(k, json_schema_to_arrow(v)) for k, v in props.items()])
    if kind == "array":
        return pa.list_(json_schema_to_arrow(schema.get("items", {"type": "string"})))
    if kind == "string":
        fmt = schema.get("format")
        if fmt == "date-time":
            return pa.timestamp("us", tz="UTC")
        if fmt == "date":
            return pa.date32()
        return pa.string()
    simple = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
    if kind not in simple:
        raise UnsupportedSchemaError(f"JSON Schema type {kind!r} is not covered")
    return simple[kind]


def json_schema_record(schema: dict[str, Any]) -> pa.Schema:
    """The lane schema of a top-level JSON Schema object (columns nullable)."""
    t = json_schema_to_arrow(schema)
    if not pa.types.is_struct(t):
        raise UnsupportedSchemaError("the top-level JSON Schema must be an object")
    return pa.schema([f.with_nullable(True) for f in t])
