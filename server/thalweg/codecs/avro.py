"""Confluent-framed Avro → Arrow.

Fast path (PERFORMANCE-NOTES: 18x per-record fastavro): the bodies of one schema id are
wrapped as an in-memory Avro Object Container File — one block per record, so every
record's size is explicit and a truncated record fails instead of shifting the ones after
it — and decoded natively by DataFusion's Avro reader. If that fails, the group is decoded
per record with fastavro so each bad record gets its own failure and the good ones
around it survive. Both paths are conformed to :func:`typemap.avro_record_schema`.

Schemas come from a :class:`SchemaLookup` — a plain in-memory mapping here; fetching from
a registry is I/O and lives outside this package (``thalweg.registry``).

Why one module of ~440 lines: the fast path and its per-record fallback must conform to
the same Arrow schema and fail the same records the same way; they are kept side by side.

Its length: the batch-native fast path and the per-record fallback it must agree with
are kept side by side on purpose.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import io
import json
import os
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.codecs.base import (
    DecodeFailure,
    DecodeReason,
    DecodeResult,
    LaneDecoder,
    admit,
    assemble,
)
from thalweg.codecs.framing import HEADER, peel, zigzag_varint
from thalweg.codecs.limits import SchemaLimits
from thalweg.codecs.typemap import (
    AvroSchema,
    UnsupportedSchemaError,
    avro_record_schema,
    branch_name,
    is_general_union,
)
from thalweg.records.columns import MetadataColumns


class SchemaLookup(Protocol):
    """Writer schemas by Confluent schema id (parsed JSON), None when unknown."""

    def get(self, schema_id: int) -> AvroSchema | None: ...


def container_file(schema: AvroSchema, bodies: list[bytes]) -> bytes:
    """An Avro Object Container File holding ``bodies``, one record per block."""
    sync = os.urandom(16)
    meta = {"avro.schema": json.dumps(schema).encode(), "avro.codec": b"null"}
    head = bytearray(b"Obj\x01")
    head += zigzag_varint(len(meta))
    for k, v in meta.items():
        head += zigzag_varint(len(k)) + k.encode() + zigzag_varint(len(v)) + v
    head += b"\x00" + sync
    one = zigzag_varint(1)
    parts = [bytes(head)]
    for body in bodies:
        parts += (one + zigzag_varint(len(body)), body, sync)
    return b"".join(parts)


class _Compiled:
    """A writer schema ready to decode: parsed for fastavro, mapped to Arrow."""

    def __init__(self, schema: AvroSchema) -> None:
        self.schema = schema
        self.parsed = fastavro.parse_schema(schema)
        self.arrow = avro_record_schema(schema)
        self.named: dict[str, Any] = {}
        _collect_named(schema, self.named)
        self.has_unions = _walk_unions(schema, self.named)
        self.has_uuid = '"uuid"' in json.dumps(schema)
        # DataFusion turns uuid strings into 16 raw bytes; on the wire a uuid is its
        # 36-character string, which is what the type map wants.
        self.native_schema = _strip_uuid(schema) if self.has_uuid else schema


class AvroArrowDecoder(LaneDecoder):
    """Decodes Confluent-framed Avro payloads of any known schema id.

    Args:
        columns: metadata names; a payload field under the prefix is refused.
        schemas: writer schemas by id.
        native: use the native container-file path (off: per-record fastavro only).
        limits: bounds on how far a writer schema may widen the lane (defaults).
    """

    def __init__(
        self,
        columns: MetadataColumns,
        schemas: SchemaLookup,
        *,
        native: bool = True,
        schema: pa.Schema | None = None,
        limits: SchemaLimits | None = None,
    ) -> None:
        super().__init__(columns, schema, limits)
        self._schemas = schemas
        self._native = native
        self._compiled: dict[int, _Compiled | Exception] = {}
        self._tmp = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()

    def _decode(self, values: pa.Array) -> DecodeResult:
        n = len(values)
        framing = peel(values)
        failures: list[DecodeFailure] = []
        for row in np.flatnonzero(framing.short):
            failures.append(
                DecodeFailure(
                    int(row),
                    DecodeReason.BAD_FRAMING,
                    "payload is shorter than the 5-byte Confluent header",
                )
            )
        for row in np.flatnonzero(framing.bad_magic):
            failures.append(
                DecodeFailure(
                    int(row),
                    DecodeReason.BAD_FRAMING,
                    "first byte is not the Confluent magic byte 0",
                )
            )
        pieces: list[tuple[np.ndarray, pa.Table]] = []
        start = self.shape
        for schema_id in np.unique(framing.ids[framing.ids >= 0]):
            rows = np.flatnonzero(framing.ids == schema_id)
            compiled = self._compile(int(schema_id))
            if isinstance(compiled, Exception):
                reason = (
                    DecodeReason.UNKNOWN_SCHEMA
                    if isinstance(compiled, LookupError)
                    else DecodeReason.UNSUPPORTED
                )
                failures += [DecodeFailure(int(r), reason, str(compiled)) for r in rows]
                continue
            # Admitted on its schema, before a row is decoded: a writer schema beyond the
            # limits (a registry schema with 100k fields) refuses its rows unread.
            merged, refused = admit(
                self._schema,
                compiled.arrow,
                rows,
                f"schema id {schema_id}",
                self._columns,
                (self._limits, start),
            )
            if merged is None:
                failures += refused
                continue
            table, bad = self._decode_group(values, rows, compiled)
            self._schema = merged
            failures += bad
            pieces.append((np.setdiff1d(rows, [f.row for f in bad]), table))
        return assemble(n, self._schema, pieces, failures)

    def _compile(self, schema_id: int) -> _Compiled | Exception:
        if schema_id not in self._compiled:
            schema = self._schemas.get(schema_id)
            if schema is None:
                self._compiled[schema_id] = LookupError(f"unknown schema id {schema_id}")
            else:
                try:
                    self._compiled[schema_id] = _Compiled(schema)
                except (UnsupportedSchemaError, fastavro.schema.SchemaParseException) as exc:
                    self._compiled[schema_id] = exc
        return self._compiled[schema_id]

    def _decode_group(
        self, values: pa.Array, rows: np.ndarray, c: _Compiled
    ) -> tuple[pa.Table, list[DecodeFailure]]:
        # An explicit stop: pyarrow 26's binary_slice fails without one.
        bodies = pc.binary_slice(values.take(pa.array(rows)), HEADER, 2**31 - 1).to_pylist()
        if self._native:
            table = self._native_decode(c, bodies)
            if table is not None:
                return table, []
        return self._fallback(c, rows, bodies)

    def _native_decode(self, c: _Compiled, bodies: list[bytes]) -> pa.Table | None:
        import datafusion

        path = os.path.join(self._tmp, f"twg-avro-{os.getpid()}-{uuid.uuid4().hex}.avro")
        try:
            with open(path, "wb") as f:
                f.write(container_file(c.native_schema, bodies))
            table = datafusion.SessionContext().read_avro(path).to_arrow_table()
            if table.num_rows != len(bodies):
                return None
            return _unions_to_structs(table.select(c.arrow.names)).cast(c.arrow)
        except Exception:  # any native failure means: decode per record
            return None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _fallback(
        self, c: _Compiled, rows: np.ndarray, bodies: list[bytes]
    ) -> tuple[pa.Table, list[DecodeFailure]]:
        records: list[dict[str, Any]] = []
        failures: list[DecodeFailure] = []
        for row, body in zip(rows, bodies, strict=True):
            try:
                rec = fastavro.schemaless_reader(
                    io.BytesIO(body),
                    c.parsed,
                    return_record_name=c.has_unions,
                    return_record_name_override=c.has_unions,
                )
            except Exception as exc:  # fastavro raises many kinds
                failures.append(
                    DecodeFailure(
                        int(row),
                        DecodeReason.SYNTAX,
                        f"invalid Avro body: {type(exc).__name__}: {exc}",
                    )
                )
                continue
            if c.has_unions:
                rec = _shape(c.schema, rec, c.named)
            records.append(_plain(rec) if c.has_uuid else rec)  # type: ignore[arg-type]
        return pa.Table.from_pylist(records, schema=c.arrow), failures


def _collect_named(schema: Any, out: dict[str, Any]) -> None:
    if isinstance(schema, list):
        for b in schema:
            _collect_named(b, out)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "enum", "fixed") and "name" in schema:
            out[schema["name"]] = schema
            out[schema["name"].rsplit(".", 1)[-1]] = schema
        for f in schema.get("fields", []):
            _collect_named(f["type"], out)
        for key in ("items", "values"):
            if key in schema:
                _collect_named(schema[key], out)


def _walk_unions(schema: Any, named: dict[str, Any], seen: frozenset[str] = frozenset()) -> bool:
    if is_general_union(schema):
        return True
    if isinstance(schema, list):
        return any(_walk_unions(b, named, seen) for b in schema)
    if isinstance(schema, str):
        target = named.get(schema)
        if target is None or schema in seen:
            return False
        return _walk_unions(target, named, seen | {schema})
    if isinstance(schema, dict):
        if any(_walk_unions(f["type"], named, seen) for f in schema.get("fields", [])):
            return True
        return any(_walk_unions(schema[k], named, seen) for k in ("items", "values") if k in schema)
    return False


_INT32 = range(-(2**31), 2**31)


def _accepts(branch: Any, value: Any, named: dict[str, Any]) -> bool:
    """Whether ``value`` (as fastavro returns it) belongs to ``branch``."""
    if isinstance(branch, str) and branch in named:
        branch = named[branch]
    if isinstance(branch, str):
        return {
            "null": value is None,
            "boolean": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool) and value in _INT32,
            "long": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, float),
            "double": isinstance(value, float),
            "string": isinstance(value, str),
            "bytes": isinstance(value, bytes),
        }.get(branch, False)
    kind, logical = branch.get("type"), branch.get("logicalType")
    if logical == "decimal":
        return isinstance(value, decimal.Decimal)
    if logical == "uuid":
        return isinstance(value, uuid.UUID)
    if logical == "date":
        return isinstance(value, dt.date) and not isinstance(value, dt.datetime)
    if logical in ("time-millis", "time-micros"):
        return isinstance(value, dt.time)
    if logical and logical.endswith(("timestamp-millis", "timestamp-micros")):
        return isinstance(value, dt.datetime)
    if kind == "record":
        name = branch["name"].rsplit(".", 1)[-1]
        return (isinstance(value, tuple) and value[0].rsplit(".", 1)[-1] == name) or isinstance(
            value, dict
        )
    if kind == "enum":
        return isinstance(value, str) and value in branch["symbols"]
    if kind == "array":
        return isinstance(value, list)
    if kind == "map":
        return isinstance(value, dict)
    if kind == "fixed":
        return isinstance(value, bytes) and len(value) == branch["size"]
    return _accepts(kind, value, named) if isinstance(kind, str) else False


def _shape(schema: Any, value: Any, named: dict[str, Any]) -> Any:
    """fastavro's value in the type map's shape: a general union becomes
    ``{branch: value}`` with one branch set; named records lose their name tag."""
    if isinstance(schema, str) and schema in named:
        schema = named[schema]
    if isinstance(schema, list):
        if value is None:
            return None
        branches = [b for b in schema if b != "null"]
        if len(branches) == 1:
            return _shape(branches[0], value, named)
        for b in branches:
            if _accepts(b, value, named):
                inner = value[1] if isinstance(value, tuple) else value
                out = dict.fromkeys(branch_name(x) for x in branches)
                out[branch_name(b)] = _shape(b, inner, named)
                return out
        raise ValueError(f"value {value!r} matches no branch of {schema!r}")
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
        value = value[1]  # a record's name tag outside a general union
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "record" and isinstance(value, dict):
            return {
                f["name"]: _shape(f["type"], value.get(f["name"]), named) for f in schema["fields"]
            }
        if kind == "array" and isinstance(value, list):
            return [_shape(schema["items"], v, named) for v in value]
        if kind == "map" and isinstance(value, dict):
            return {k: _shape(schema["values"], v, named) for k, v in value.items()}
    return value


def _unions_to_structs(table: pa.Table) -> pa.Table:
    """DataFusion's dense unions → the type map's struct-of-branches, column by column."""
    columns = [_union_column(col) for col in table.columns]
    return pa.Table.from_arrays(columns, names=table.column_names)


def _union_column(col: pa.ChunkedArray) -> pa.ChunkedArray:
    if not pa.types.is_union(col.type):
        return col
    chunks = []
    for arr in col.chunks:
        types = np.asarray(arr.type_codes)
        offsets = np.asarray(arr.offsets)
        fields, children = [], []
        is_null = np.zeros(len(arr), dtype=bool)
        for i, f in enumerate(arr.type):
            if pa.types.is_null(f.type):
                is_null |= types == arr.type.type_codes[i]
                continue
            hit = types == arr.type.type_codes[i]
            idx = pa.array(np.where(hit, offsets, 0), mask=~hit)
            fields.append(pa.field(f.name, f.type))
            children.append(arr.field(i).take(idx))
        chunks.append(pa.StructArray.from_arrays(children, fields=fields, mask=pa.array(is_null)))
    return pa.chunked_array(chunks)


def _strip_uuid(schema: Any) -> Any:
    if isinstance(schema, dict):
        if schema.get("logicalType") == "uuid":
            return {k: v for k, v in schema.items() if k != "logicalType"}
        return {k: _strip_uuid(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_strip_uuid(v) for v in schema]
    return schema


def _plain(value: Any) -> Any:
    """UUIDs as strings (the type map's choice), recursively."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class StaticSchemas(Mapping[int, AvroSchema]):
    """Schemas known up front (tests, air-gapped deployments): id → parsed schema."""

    def __init__(self, schemas: Mapping[int, AvroSchema | str]) -> None:
        self._schemas = {
            int(k): (json.loads(v) if isinstance(v, str) else v) for k, v in schemas.items()
        }

    def get(self, schema_id: int, default: Any = None) -> AvroSchema | None:
        return self._schemas.get(schema_id, default)

    def __getitem__(self, schema_id: int) -> AvroSchema:
        return self._schemas[schema_id]

    def __iter__(self) -> Any:
        return iter(self._schemas)

    def __len__(self) -> int:
        return len(self._schemas)


def container_batches(path: str, schema: AvroSchema) -> Iterator[pa.Table]:
    """The records of the Avro Object Container File at ``path`` (a local file), in
    order, through DataFusion's native reader — the streaming decoder's fast path —
    typed by the type map. Raises on whatever it cannot read natively (a damaged block,
    a ``uuid`` field, which it turns into raw bytes): the caller reads per record."""
    import datafusion

    c = _Compiled(schema)
    if c.has_uuid:
        raise ValueError("uuid fields are read per record")
    for batch in datafusion.SessionContext().read_avro(path).execute_stream():
        table = pa.Table.from_batches([batch.to_pyarrow()])
        yield _unions_to_structs(table.select(c.arrow.names)).cast(c.arrow)


def decode_container(data: bytes) -> tuple[pa.Table, AvroSchema]:
    """An Avro Object Container File (any codec fastavro reads) as an Arrow table typed by
    the type map, plus its writer schema. Native when DataFusion can, fastavro otherwise.

    Raises:
        UnsupportedSchemaError: the file's schema is outside the type map.
        ValueError: the bytes are not an Avro container file.
    """
    try:
        reader = fastavro.reader(io.BytesIO(data))
    except Exception as exc:  # fastavro raises several kinds for a bad header
        raise ValueError(f"not an Avro container file: {exc}") from exc
    schema = reader.writer_schema
    arrow = _Compiled(schema).arrow
    tmp = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    path = os.path.join(tmp, f"twg-ocf-{os.getpid()}-{uuid.uuid4().hex}.avro")
    try:
        with open(path, "wb") as f:
            f.write(data)
        import datafusion

        table = datafusion.SessionContext().read_avro(path).to_arrow_table()
        return table.select(arrow.names).cast(arrow), schema
    except Exception:  # decode per record instead
        records = [_plain(r) for r in fastavro.reader(io.BytesIO(data))]
        return pa.Table.from_pylist(records, schema=arrow), schema
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
