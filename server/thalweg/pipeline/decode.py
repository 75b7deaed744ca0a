"""The decode stage: fetched raw-lane batches → decoded-lane tables (payload + locator
+ error), one row per raw row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pyarrow as pa

from thalweg.codecs.base import ArrowDecoder, DecodeFailure, DecodeResult
from thalweg.records.columns import DECODE_ERROR, MetadataColumns


def decode_batch(
    decoder: ArrowDecoder, raw: pa.RecordBatch, columns: MetadataColumns
) -> tuple[pa.Table, DecodeResult]:
    """Decode ``raw``'s values; the result holds the same rows in the same order."""
    # File rows carry their typed fields beside the raw columns (records.file_rows).
    i = raw.schema.get_field_index(columns.payload)
    result = decoder.decode(raw.column(i if i >= 0 else columns.value))
    return _with_locators(result, raw, columns), result


@dataclass(frozen=True, slots=True)
class Decoded:
    """One batch's decoded rows (payload + locator + error), its failures (rows indexed
    within it) and the bytes its rows hold (for the buffer bound)."""

    table: pa.Table
    failures: tuple[DecodeFailure, ...]
    nbytes: int


def decode_batches(
    decoder: ArrowDecoder, raws: Sequence[pa.RecordBatch], columns: MetadataColumns
) -> list[Decoded]:
    """Decode several batches of one topic (a fetch's partitions) in one decoder call;
    each batch gets the rows and failures :func:`decode_batch` would give it alone.

    A decoder call has a fixed cost of about a millisecond (JSON: the parser's set-up,
    schema conforming), whatever it decodes. A fetch over many partitions brings a small
    batch of each, and decoded one by one that cost was most of a gateway's CPU at 32
    partitions; joined, a topic pays it once a fetch. The decoded schema and its limits
    see the fetch as one batch (``schema_limits.max_new_fields_per_batch`` counts the
    fields one fetch adds); a type conflict fails the same rows either way.
    """
    if len(raws) == 1 or any(r.schema.get_field_index(columns.payload) >= 0 for r in raws):
        out = []
        for raw in raws:  # file rows are typed apart
            table, result = decode_batch(decoder, raw, columns)
            out.append(Decoded(table, result.failures, table.nbytes))
        return out
    values = pa.concat_arrays([r.column(columns.value) for r in raws])
    whole = decoder.decode(values)
    # Each batch's share of the decoded bytes by rows: its slices would each count the
    # shared buffers whole, and measuring every slice costs more than the decode.
    per_row = (whole.table.nbytes + whole.errors.nbytes) / max(1, len(values))
    out = []
    start = 0
    for raw in raws:
        n = raw.num_rows
        end = start + n
        result = DecodeResult(
            whole.table.slice(start, n),
            whole.errors.slice(start, n),
            tuple(replace(f, row=f.row - start) for f in whole.failures if start <= f.row < end),
        )
        out.append(Decoded(_with_locators(result, raw, columns), result.failures, int(per_row * n)))
        start = end
    return out


def _with_locators(result: DecodeResult, raw: pa.RecordBatch, columns: MetadataColumns) -> pa.Table:
    """The decoded rows with the raw lane's locator columns and the error column.

    Assembled column by column: a payload table can have no columns at all (every value
    a tombstone or a failure), and a zero-column table cannot carry a row count.
    """
    fields = list(result.table.schema)
    arrays = list(result.table.columns)
    for f in columns.locator_fields:
        fields.append(f)
        arrays.append(pa.chunked_array([raw.column(f.name)]))
    fields.append(pa.field(columns.decode_error, DECODE_ERROR[1]))
    arrays.append(pa.chunked_array([result.errors]))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
