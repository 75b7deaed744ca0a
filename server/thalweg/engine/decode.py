"""Build the decoded-lane table of one fetched batch: payload + locator + error."""

from __future__ import annotations

import pyarrow as pa

from thalweg.codecs.base import ArrowDecoder, DecodeResult
from thalweg.records.columns import DECODE_ERROR, MetadataColumns


def decode_batch(
    decoder: ArrowDecoder, raw: pa.RecordBatch, columns: MetadataColumns
) -> tuple[pa.Table, DecodeResult]:
    """Decode ``raw``'s values; the result holds the same rows in the same order."""
    result = decoder.decode(raw.column(columns.value))
    table = result.table
    for f in columns.locator_fields:
        table = table.append_column(f, pa.chunked_array([raw.column(f.name)]))
    table = table.append_column(
        pa.field(columns.decode_error, DECODE_ERROR[1]), pa.chunked_array([result.errors])
    )
    return table, result
