"""Arrow rows → payloads, for producing (the do_put direction).

Per record by nature (a payload is one record), so this is Python per row; the formats
mirror the decoders: Confluent-framed Avro (magic 0 + schema id + body) and JSON.
"""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import fastavro
import pyarrow as pa

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
