"""Build the decoded-lane table of one fetched batch: payload + locator + error."""

from __future__ import annotations

import pyarrow as pa

from thalweg.codecs.base import ArrowDecoder, DecodeResult
from thalweg.records.columns import DECODE_ERROR, MetadataColumns


def decode_batch(
    decoder: ArrowDecoder, raw: pa.RecordBatch, columns: MetadataColumns
) -> tuple[pa.Table, DecodeResult]:
    """Decode ``raw``'s values; the result holds the same rows in the same order.

    Assembled column by column: a payload table can have no columns at all (every value
    a tombstone or a failure), and a zero-column table cannot carry a row count.
    """
    # File rows carry their typed fields beside the raw columns (records.file_rows).
    i = raw.schema.get_field_index(columns.payload)
    result = decoder.decode(raw.column(i if i >= 0 else columns.value))
    fields = list(result.table.schema)
    arrays = list(result.table.columns)
    for f in columns.locator_fields:
        fields.append(f)
        arrays.append(pa.chunked_array([raw.column(f.name)]))
    fields.append(pa.field(columns.decode_error, DECODE_ERROR[1]))
    arrays.append(pa.chunked_array([result.errors]))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields)), result
