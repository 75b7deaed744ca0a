"""Confluent-framed Avro → Arrow.

Fast path (PERFORMANCE-NOTES: 18x per-record fastavro): the bodies of one schema id are
wrapped as an in-memory Avro Object Container File — one block per record, so every
record's size is explicit and a truncated record fails instead of shifting the ones after
it — and decoded natively by DataFusion's Avro reader. If that fails, the group is decoded
per record with fastavro so each bad record gets its own failure and the good ones
around it survive. Both paths are conformed to :func:`typemap.avro_record_schema`.

Schemas come from a :class:`SchemaLookup` — a plain in-memory mapping here; fetching from
a registry is I/O and lives outside this package (``thalweg.registry``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import threading
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.codecs.base import DecodeFailure, DecodeReason, DecodeResult, admit, assemble
from thalweg.codecs.framing import HEADER, peel
from thalweg.codecs.typemap import AvroSchema, UnsupportedSchemaError, avro_record_schema
from thalweg.records.columns import MetadataColumns


class SchemaLookup(Protocol):
    """Writer schemas by Confluent schema id (parsed JSON), None when unknown."""

    def get(self, schema_id: int) -> AvroSchema | None: ...


def _varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def container_file(schema: AvroSchema, bodies: list[bytes]) -> bytes:
    """An Avro Object Container File holding ``bodies``, one record per block."""
    sync = os.urandom(16)
    meta = {"avro.schema": json.dumps(schema).encode(), "avro.codec": b"null"}
    head = bytearray(b"Obj\x01")
    head += _varint(len(meta))
    for k, v in meta.items():
        head += _varint(len(k)) + k.encode() + _varint(len(v)) + v
    head += b"\x00" + sync
    one = _varint(1)
    parts = [bytes(head)]
    for body in bodies:
        parts += (one + _varint(len(body)), body, sync)
    return b"".join(parts)


class _Compiled:
    """A writer schema ready to decode: parsed for fastavro, mapped to Arrow."""

    def __init__(self, schema: AvroSchema) -> None:
        self.schema = schema
        self.parsed = fastavro.parse_schema(schema)
        self.arrow = avro_record_schema(schema)
        if any(_has_union(f.type) for f in self.arrow):
            raise UnsupportedSchemaError(
                "unions other than [null, T] map to Arrow dense unions, which this version "
                "does not decode yet"
            )
        self.has_uuid = '"uuid"' in json.dumps(schema)
        # DataFusion turns uuid strings into 16 raw bytes; on the wire a uuid is its
        # 36-character string, which is what the type map wants.
        self.native_schema = _strip_uuid(schema) if self.has_uuid else schema


class AvroArrowDecoder:
    """Decodes Confluent-framed Avro payloads of any known schema id.

    Args:
        columns: metadata names; a payload field under the prefix is refused.
        schemas: writer schemas by id.
        native: use the native container-file path (off: per-record fastavro only).
    """

    def __init__(
        self,
        columns: MetadataColumns,
        schemas: SchemaLookup,
        *,
        native: bool = True,
        schema: pa.Schema | None = None,
    ) -> None:
        self._columns = columns
        self._schemas = schemas
        self._native = native
        self._compiled: dict[int, _Compiled | Exception] = {}
        self._schema = schema if schema is not None else pa.schema([])
        self._lock = threading.Lock()
        self._tmp = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def decode(self, values: pa.Array) -> DecodeResult:
        with self._lock:
            return self._decode(values)

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
            table, bad = self._decode_group(values, rows, compiled)
            merged, refused = admit(
                self._schema, table.schema, rows, f"schema id {schema_id}", self._columns
            )
            if merged is None:
                failures += refused
                continue
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
            return table.select(c.arrow.names).cast(c.arrow)
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
                rec = fastavro.schemaless_reader(io.BytesIO(body), c.parsed)
            except Exception as exc:  # fastavro raises many kinds
                failures.append(
                    DecodeFailure(
                        int(row),
                        DecodeReason.SYNTAX,
                        f"invalid Avro body: {type(exc).__name__}: {exc}",
                    )
                )
                continue
            records.append(_plain(rec) if c.has_uuid else rec)  # type: ignore[arg-type]
        return pa.Table.from_pylist(records, schema=c.arrow), failures


def _has_union(t: pa.DataType) -> bool:
    if pa.types.is_union(t):
        return True
    return any(_has_union(t.field(i).type) for i in range(t.num_fields))


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
