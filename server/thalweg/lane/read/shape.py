"""Give lane data the shape a reader asked for: lane, metadata policy, stream schema."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from thalweg.errors import InvariantError
from thalweg.records.columns import MetadataColumns, MetadataPolicy
from thalweg.records.raw_batch import constant


def decoded_schema(
    payload: pa.Schema, columns: MetadataColumns, policy: MetadataPolicy
) -> pa.Schema:
    """Payload columns first, then the metadata columns the policy keeps."""
    return pa.schema([*payload, *columns.metadata_fields(policy)])


#: A table whose chunks average fewer rows than this is combined before it is written or
#: sent: every chunk costs a Parquet page set, an IPC message or a Flight batch of its
#: own. A segment of a hundred fetched batches wrote in half the CPU combined first.
SMALL_CHUNK_ROWS = 16 * 1024


def few_chunks(table: pa.Table) -> pa.Table:
    """``table``, its chunks combined when there are many small ones (the live tail's
    fetched batches); row-group-sized chunks are kept (copying them costs more)."""
    chunks = table.column(0).num_chunks if table.num_columns else 0
    if chunks > 1 and table.num_rows / chunks < SMALL_CHUNK_ROWS:
        return table.combine_chunks()
    return table


def concat_decoded(tables: list[pa.Table]) -> pa.Table:
    """Decoded tables of one lane as one. Later batches may know more fields (the schema
    only grows): then unified by name — only then, as unifying a hundred small tables'
    schemas costs milliseconds, on the event loop or a stream's thread."""
    first = tables[0].schema
    if all(t.schema.equals(first) for t in tables[1:]):
        return pa.concat_tables(tables)
    return pa.concat_tables(tables, promote_options="permissive")


def fit_stream_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Give ``table`` exactly ``schema``: drop extra columns, add missing ones as nulls.

    A column whose type cannot be cast (a field that was all-null when the stream began
    and has a type now) becomes nulls in this stream; the raw lane keeps the value.
    """
    arrays = []
    for f in schema:
        if f.name not in table.column_names:
            arrays.append(pa.nulls(table.num_rows, f.type))
            continue
        col = table.column(f.name)
        if col.type != f.type:
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                col = pa.chunked_array([pa.nulls(table.num_rows, f.type)])
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)


def shape_decoded(
    decoded: pa.Table,
    raw: pa.Table | None,
    schema: pa.Schema,
    columns: MetadataColumns,
    policy: MetadataPolicy,
    emit_ts_us: int,
) -> pa.Table:
    """Build stream rows from a decoded table (and its raw twin, for ``all``).

    ``none`` keeps payload columns only and drops rows that failed to decode (they are
    in the raw lane, and visible under ``locator``/``all`` with their error).
    """
    if policy is MetadataPolicy.NONE:
        decoded = decoded.filter(pc.is_null(decoded.column(columns.decode_error)))
        return fit_stream_schema(decoded, schema)
    if policy is MetadataPolicy.ALL:
        if raw is None:
            raise InvariantError("raw is not set")
        extra = {name: raw.column(name) for name in raw.column_names}
        if columns.emit_ts in schema.names:  # a projected read may not send it
            extra[columns.emit_ts] = constant(
                emit_ts_us, schema.field(columns.emit_ts).type, raw.num_rows
            )
        for name, col in extra.items():
            if name not in decoded.column_names or name == columns.emit_ts:
                decoded = decoded.append_column(name, col)
    return fit_stream_schema(decoded, schema)
