"""Arrow rows → payloads, for producing (the do_put direction).

Per record by nature (a payload is one record), so this is Python per row; the formats
mirror the decoders: Confluent-framed Avro (magic 0 + schema id + body) and JSON.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import struct
from typing import Any

import fastavro
import pyarrow as pa

from thalweg.codecs.framing import zigzag_varint
from thalweg.codecs.typemap import AvroSchema


def _avro_ready(value: Any) -> Any:
    """Arrow's Python values in the shapes fastavro expects (maps are dicts)."""
    if isinstance(value, list):
        if value and isinstance(value[0], tuple) and len(value[0]) == 2:
            return {k: _avro_ready(v) for k, v in value}
        return [_avro_ready(v) for v in value]
    if isinstance(value, dict):
        return {k: _avro_ready(v) for k, v in value.items()}
    return value


class AvroEncoder:
    """Encodes rows with one writer schema, framed with its registry id."""

    def __init__(self, schema_id: int, schema: AvroSchema) -> None:
        self.schema_id = schema_id
        self._parsed = fastavro.parse_schema(schema)
        self._header = b"\x00" + struct.pack(">I", schema_id)

    def encode(self, table: pa.Table | pa.RecordBatch) -> list[bytes]:
        out = []
        for row in table.to_pylist():
            buf = io.BytesIO()
            buf.write(self._header)
            fastavro.schemaless_writer(buf, self._parsed, _avro_ready(row))
            out.append(buf.getvalue())
        return out


class JsonEncoder:
    """Encodes rows as JSON objects (timestamps and decimals as strings, bytes as latin-1)."""

    def encode(self, table: pa.Table | pa.RecordBatch) -> list[bytes]:
        return [json.dumps(row, default=_json_default).encode() for row in table.to_pylist()]


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)


class ProtobufEncoder:
    """Encodes rows as one Protobuf message type, framed with schema id and indexes.

    Args:
        schema_id: the registry id of the schema.
        message_class: the message class (from :class:`thalweg.codecs.protobuf.ProtoSchema`).
        indexes: where the message sits in its file (Confluent's message indexes).
    """

    def __init__(
        self, schema_id: int, message_class: Any, indexes: list[int] | None = None
    ) -> None:
        from google.protobuf import json_format

        self._parse = json_format.ParseDict
        self._cls = message_class
        idx = indexes or [0]
        tail = (
            b"\x00"
            if idx == [0]
            else zigzag_varint(len(idx)) + b"".join(zigzag_varint(i) for i in idx)
        )
        self._header = b"\x00" + struct.pack(">I", schema_id) + tail

    def encode(self, table: pa.Table | pa.RecordBatch) -> list[bytes]:
        out = []
        for row in table.to_pylist():
            msg = self._parse(_proto_ready(row), self._cls())
            out.append(self._header + msg.SerializeToString())
        return out


def _proto_ready(value: Any) -> Any:
    """Arrow's Python values as protobuf's JSON mapping expects them."""
    if isinstance(value, dict):
        return {k: _proto_ready(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        if value and isinstance(value[0], tuple) and len(value[0]) == 2:
            return {str(k): _proto_ready(v) for k, v in value}
        return [_proto_ready(v) for v in value]
    if isinstance(value, bytes):
        import base64

        return base64.b64encode(value).decode()
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.timedelta):
        return f"{value.total_seconds():.6f}s"
    return value
