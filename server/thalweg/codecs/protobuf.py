"""Confluent-framed Protobuf → Arrow.

Wire format: magic byte 0, 4-byte schema id, then the *message indexes* (a zigzag-varint
count followed by that many zigzag varints; a single 0 byte means ``[0]``) that pick the
message type inside the schema's file, then the protobuf body.

Schemas are ``FileDescriptorSet``s (from a descriptor-set file, or compiled from the
registry's ``.proto`` text outside this package). Each payload is parsed by the protobuf
runtime (upb, in C) and its fields read into Arrow columns typed by
:func:`proto_message_schema` — one type map for every message.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError as ProtoDecodeError

from thalweg.codecs.base import (
    DecodeFailure,
    DecodeReason,
    DecodeResult,
    LaneDecoder,
    admit,
    assemble,
)
from thalweg.codecs.framing import HEADER, peel
from thalweg.codecs.limits import SchemaLimits
from thalweg.codecs.typemap import UnsupportedSchemaError
from thalweg.errors import InvariantError
from thalweg.records.columns import MetadataColumns

_UTC = dt.UTC
_SCALARS: dict[int, pa.DataType] = {
    FieldDescriptor.TYPE_DOUBLE: pa.float64(),
    FieldDescriptor.TYPE_FLOAT: pa.float32(),
    FieldDescriptor.TYPE_INT64: pa.int64(),
    FieldDescriptor.TYPE_SINT64: pa.int64(),
    FieldDescriptor.TYPE_SFIXED64: pa.int64(),
    FieldDescriptor.TYPE_UINT64: pa.uint64(),
    FieldDescriptor.TYPE_FIXED64: pa.uint64(),
    FieldDescriptor.TYPE_INT32: pa.int32(),
    FieldDescriptor.TYPE_SINT32: pa.int32(),
    FieldDescriptor.TYPE_SFIXED32: pa.int32(),
    FieldDescriptor.TYPE_UINT32: pa.uint32(),
    FieldDescriptor.TYPE_FIXED32: pa.uint32(),
    FieldDescriptor.TYPE_BOOL: pa.bool_(),
    FieldDescriptor.TYPE_STRING: pa.string(),
    FieldDescriptor.TYPE_BYTES: pa.binary(),
    FieldDescriptor.TYPE_ENUM: pa.string(),
}
_WRAPPERS = {
    "google.protobuf.DoubleValue": pa.float64(),
    "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(),
    "google.protobuf.UInt64Value": pa.uint64(),
    "google.protobuf.Int32Value": pa.int32(),
    "google.protobuf.UInt32Value": pa.uint32(),
    "google.protobuf.BoolValue": pa.bool_(),
    "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
_TIMESTAMP = "google.protobuf.Timestamp"
_DURATION = "google.protobuf.Duration"


def _message_type(d: Descriptor, seen: tuple[str, ...]) -> pa.DataType:
    name = d.full_name
    if name == _TIMESTAMP:
        return pa.timestamp("us", tz="UTC")
    if name == _DURATION:
        return pa.duration("us")
    if name in _WRAPPERS:
        return _WRAPPERS[name]
    if name in seen:
        raise UnsupportedSchemaError(f"recursive message {name} has no finite Arrow type")
    return pa.struct([_field(f, (*seen, name)) for f in d.fields])


def _field(f: FieldDescriptor, seen: tuple[str, ...]) -> pa.Field:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        key = _field(f.message_type.fields_by_name["key"], seen).type
        value = _field(f.message_type.fields_by_name["value"], seen).type
        return pa.field(f.name, pa.map_(key, value))
    t = (
        _message_type(f.message_type, seen)
        if f.type == FieldDescriptor.TYPE_MESSAGE
        else _SCALARS[f.type]
    )
    if _is_repeated(f):
        return pa.field(f.name, pa.list_(t))
    return pa.field(f.name, t)


def _is_repeated(f: FieldDescriptor) -> bool:
    # protobuf >= 6 has ``is_repeated``; older runtimes only ``label``.
    repeated = getattr(f, "is_repeated", None)
    if repeated is None:
        return bool(f.label == FieldDescriptor.LABEL_REPEATED)
    return bool(repeated)


def proto_message_schema(d: Descriptor) -> pa.Schema:
    """The lane schema of a message: one nullable column per field.

    Scalars map to their Arrow equivalents (unsigned stay unsigned), enums to their value
    name, nested messages to structs, repeated to lists, maps to Arrow maps;
    ``Timestamp`` → ``timestamp[us, UTC]``, ``Duration`` → ``duration[us]``, wrappers →
    their nullable scalar. Recursive messages are refused.
    """
    return pa.schema([_field(f, (d.full_name,)).with_nullable(True) for f in d.fields])


def _value(f: FieldDescriptor, v: Any) -> Any:
    if f.type == FieldDescriptor.TYPE_ENUM:
        ev = f.enum_type.values_by_number.get(v)
        return ev.name if ev is not None else str(v)
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        return _message(v)
    return v


def _message(m: Any) -> Any:
    d = m.DESCRIPTOR
    name = d.full_name
    if name == _TIMESTAMP:
        return dt.datetime(1970, 1, 1, tzinfo=_UTC) + dt.timedelta(
            seconds=m.seconds, microseconds=m.nanos // 1000
        )
    if name == _DURATION:
        return dt.timedelta(seconds=m.seconds, microseconds=m.nanos // 1000)
    if name in _WRAPPERS:
        return m.value
    return to_dict(m)


def to_dict(m: Any) -> dict[str, Any]:
    """A message as Python values in the shapes :func:`proto_message_schema` declares."""
    out: dict[str, Any] = {}
    for f in m.DESCRIPTOR.fields:
        v = getattr(m, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            vf = f.message_type.fields_by_name["value"]
            out[f.name] = [(k, _value(vf, v[k])) for k in v]
        elif _is_repeated(f):
            out[f.name] = [_value(f, x) for x in v]
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            out[f.name] = _message(v) if m.HasField(f.name) else None
        elif f.has_presence and not m.HasField(f.name):
            out[f.name] = None  # proto3 optional / oneof member not set
        else:
            out[f.name] = _value(f, v)
    return out


def _zigzag_varints(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated message-index varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("message-index varint too long")
    return (result >> 1) ^ -(result & 1), pos


def message_indexes(body: bytes) -> tuple[list[int], int]:
    """The message indexes at the start of ``body`` and where the protobuf bytes begin."""
    count, pos = _zigzag_varints(body, 0)
    if count == 0:
        return [0], pos
    if count < 0 or count > 100:
        raise ValueError(f"implausible message-index count {count}")
    indexes = []
    for _ in range(count):
        i, pos = _zigzag_varints(body, pos)
        indexes.append(i)
    return indexes, pos


class ProtoSchema:
    """The messages of one schema (a FileDescriptorSet whose last file is the schema)."""

    def __init__(self, descriptor_set: bytes) -> None:
        fds = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
        if not fds.file:
            raise UnsupportedSchemaError("empty descriptor set")
        self._pool = descriptor_pool.DescriptorPool()
        for f in fds.file:
            self._pool.Add(f)
        self._file = self._pool.FindFileByName(fds.file[-1].name)
        self._types: dict[tuple[int, ...], tuple[Any, pa.Schema]] = {}

    def message(self, indexes: Sequence[int]) -> tuple[Any, pa.Schema]:
        """The message class and lane schema at ``indexes`` (Confluent's addressing:
        top-level messages of the file, then nested types — map entry types included, as
        Confluent's serializers count them)."""
        key = tuple(indexes)
        if key not in self._types:
            try:
                d = list(self._file.message_types_by_name.values())[indexes[0]]
                for i in indexes[1:]:
                    d = d.nested_types[i]
            except IndexError as exc:
                raise LookupError(f"no message at indexes {list(indexes)}") from exc
            self._types[key] = (message_factory.GetMessageClass(d), proto_message_schema(d))
        return self._types[key]


class ProtoLookup(Protocol):
    def get(self, schema_id: int) -> ProtoSchema | None: ...


class ProtobufArrowDecoder(LaneDecoder):
    """Decodes Confluent-framed Protobuf payloads into one lane per topic."""

    def __init__(
        self,
        columns: MetadataColumns,
        schemas: ProtoLookup,
        *,
        schema: pa.Schema | None = None,
        limits: SchemaLimits | None = None,
    ) -> None:
        super().__init__(columns, schema, limits)
        self._schemas = schemas

    def _decode(self, values: pa.Array) -> DecodeResult:
        framing = peel(values)
        failures = [
            DecodeFailure(
                int(row), DecodeReason.BAD_FRAMING, "no Confluent header (magic byte 0 + schema id)"
            )
            for row in np.flatnonzero(framing.short | framing.bad_magic)
        ]
        groups, parse_failures = self._parse(values.to_pylist(), framing.ids)
        failures += parse_failures
        pieces: list[tuple[np.ndarray, pa.Table]] = []
        start = self.shape
        for (schema_id, _), (arrow, items) in groups.items():
            rows = np.array([r for r, _ in items], dtype=np.int64)
            merged, refused = admit(
                self._schema,
                arrow,
                rows,
                f"schema id {schema_id}",
                self._columns,
                (self._limits, start),
            )
            if merged is None:
                failures += refused
                continue
            self._schema = merged
            pieces.append((rows, pa.Table.from_pylist([d for _, d in items], schema=arrow)))
        return assemble(len(values), self._schema, pieces, failures)

    def _parse(
        self, payloads: list[bytes | None], ids: np.ndarray
    ) -> tuple[
        dict[tuple[int, tuple[int, ...]], tuple[pa.Schema, list[tuple[int, dict[str, Any]]]]],
        list[DecodeFailure],
    ]:
        """Parse every framed payload; group rows by (schema id, message indexes)."""
        groups: dict[
            tuple[int, tuple[int, ...]], tuple[pa.Schema, list[tuple[int, dict[str, Any]]]]
        ] = {}
        failures: list[DecodeFailure] = []
        for found in np.flatnonzero(ids >= 0):
            row, schema_id = int(found), int(ids[found])
            body = payloads[row]
            if body is None:
                raise InvariantError("body is not set")
            body = body[HEADER:]
            schema = self._schemas.get(schema_id)
            if schema is None:
                failures.append(
                    DecodeFailure(
                        row, DecodeReason.UNKNOWN_SCHEMA, f"unknown schema id {schema_id}"
                    )
                )
                continue
            try:
                indexes, start = message_indexes(body)
                cls, arrow = schema.message(indexes)
                msg = cls.FromString(body[start:])
            except UnsupportedSchemaError as exc:  # before ValueError: it is one
                failures.append(DecodeFailure(row, DecodeReason.UNSUPPORTED, str(exc)))
                continue
            except (ValueError, LookupError) as exc:
                failures.append(DecodeFailure(row, DecodeReason.BAD_FRAMING, str(exc)))
                continue
            except ProtoDecodeError as exc:
                failures.append(DecodeFailure(row, DecodeReason.SYNTAX, f"invalid protobuf: {exc}"))
                continue
            groups.setdefault((schema_id, tuple(indexes)), (arrow, []))[1].append(
                (row, to_dict(msg))
            )
        return groups, failures
