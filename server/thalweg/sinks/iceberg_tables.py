"""An Iceberg table as the sink shapes it (``sinks/iceberg.py``): created with its
partition spec in one commit, evolved by added columns and widened types only, data
files written for its current spec and schema, and an upsert's look at which keys it
holds from a newer position."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError, ValidationError
from pyiceberg.io.pyarrow import (  # the two steps of Table.append, taken apart
    _check_pyarrow_schema_compatible,
    _dataframe_to_data_files,
)
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.upsert_util import create_match_filter

from thalweg.records import unavailable
from thalweg.records.unavailable import UNAVAILABLE
from thalweg.sinks import schema_change
from thalweg.sinks.base import SinkSchemaError
from thalweg.sinks.fold import ROW, numbered, taken
from thalweg.sinks.iceberg_types import parse_transform, same_types
from thalweg.sinks.table_docs import NONE as NO_DOCS
from thalweg.sinks.table_docs import TableDocs


def create_table(
    catalog: Catalog,
    ident: str,
    schema: pa.Schema,
    partition_by: list[str],
    docs: TableDocs = NO_DOCS,
) -> tuple[Table, bool]:
    """The table and its partition spec in one commit — a spec that cannot be made
    leaves no unpartitioned table behind to be appended to — and whether this call made
    it (False: another writer created it first, and that table is answered).

    Raises:
        SinkSchemaError: ``partition_by`` does not fit the rows.
    """
    tx = catalog.create_table_transaction(
        ident, schema=docs.with_docs(schema), properties=_properties(docs)
    )
    try:
        if partition_by:
            spec = tx.update_spec()
            for text in partition_by:
                transform, column = parse_transform(text)
                spec.add_field(column, transform, f"{column}_{text.split('(')[0]}")
            spec.commit()
    except (ValueError, ValidationError) as exc:
        raise SinkSchemaError(
            f"iceberg table {ident}: partition_by {partition_by} "
            f"does not fit the rows ({exc}); columns: {', '.join(schema.names)}"
        ) from exc
    try:
        tx.commit_transaction()
    except (CommitFailedException, TableAlreadyExistsError):
        return catalog.load_table(ident), False
    return catalog.load_table(ident), True


def evolve(table: Table, schema: pa.Schema, ident: str, docs: TableDocs = NO_DOCS) -> bool:
    """Add new columns and widen types, refuse any other change; then sync the table's
    docs (``describe``): True when its properties were written.

    Raises:
        SinkSchemaError: the change is neither.
    """
    current = table.schema().as_arrow()
    if not all(f.name in current.names for f in schema) or not same_types(current, schema):
        _apply(table, docs.with_docs(schema), ident, current)
    return describe(table, docs, schema)


def describe(table: Table, docs: TableDocs, schema: pa.Schema) -> bool:
    """Give the table's columns of ``schema`` their comments and the table its
    properties where they differ (ADR 0042; nothing written when all agree): True when
    its properties were written."""
    if not docs.speaks_of(schema):
        return False
    fields = {f.name: f for f in table.schema().fields}
    stale = {c: d for c, d in docs.comments(schema).items() if c in fields and fields[c].doc != d}
    if stale:
        with table.update_schema() as update:
            for column, doc in stale.items():
                update.update_column(column, doc=doc)
    changed = {k: v for k, v in _properties(docs).items() if table.properties.get(k) != v}
    if changed:
        with table.transaction() as tx:
            tx.set_properties(changed)
    return bool(changed)


def _properties(docs: TableDocs) -> dict[str, str]:
    """The table properties of ``docs``: the description as ``comment`` (what Spark,
    Trino and Glue show), the contract's properties and tags."""
    comment = {"comment": docs.description} if docs.description else {}
    return {**comment, **docs.table_properties()}


def _apply(table: Table, schema: pa.Schema, ident: str, current: pa.Schema) -> None:
    try:
        with table.update_schema() as update:
            update.union_by_name(schema)
    except (ValidationError, ValueError, TypeError) as exc:
        found = schema_change.conflict(current, schema)
        what = (
            found.describe() if found is not None else f"the rows' schema cannot be applied ({exc})"
        )
        raise SinkSchemaError(
            f"iceberg table {ident}: {what}; only added columns and widened types (int → "
            'long, float → double) are applied: change the table (docs/sinks.md, "Schema '
            'changes") and the sink resumes from its coverage'
        ) from exc


def write_files(table: Table, data: pa.Table) -> list[DataFile]:
    """``data`` as data files of ``table`` (not committed).

    Raises:
        SinkSchemaError: the rows do not fit the table's schema.
    """
    try:
        _check_pyarrow_schema_compatible(
            table.schema(),
            provided_schema=data.schema,
            format_version=table.metadata.format_version,
        )
    except ValueError as exc:
        raise SinkSchemaError(
            f"iceberg table {table.name()}: rows do not fit the table: {exc}"
        ) from exc
    return list(_dataframe_to_data_files(table.metadata, data, table.io))


def newer_than_held(
    table: Table, newest: pa.Table, key: list[str], position: str
) -> tuple[pa.Table, pa.Table]:
    """The rows of ``newest`` whose key the table holds from no newer ``position``, and
    of those, the ones whose key the table holds (their old rows are to be deleted).
    The columns a row names as unavailable (``__unavailable``) keep the held row's value
    (read in the same scan)."""
    if not newest.num_rows or table.current_snapshot() is None:
        return newest, newest.slice(0, 0)
    names = {f.name for f in table.schema().fields}
    keeps = [c for c in [*unavailable.named(newest), UNAVAILABLE] if c in names]
    held = table.scan(
        row_filter=create_match_filter(newest, key),
        selected_fields=(*key, position, *dict.fromkeys(keeps)),
    ).to_arrow()
    if not held.num_rows:
        return newest, newest.slice(0, 0)
    slim = held.select([*key, position]).rename_columns([*key, "_held"])
    slim = slim.cast(
        pa.schema([*(newest.schema.field(k) for k in key), pa.field("_held", pa.int64())])
    )
    joined = numbered(newest, key, position).join(slim, key, join_type="left outer")
    held_at = joined.column("_held")
    newer = pc.or_kleene(pc.is_null(held_at), pc.greater(joined.column(position), held_at))
    fresh = joined.filter(newer)
    replaced = fresh.filter(pc.is_valid(fresh.column("_held")))
    kept = taken(newest, fresh.column(ROW))
    if keeps:
        kept = unavailable.from_held(kept, held, key, position)
    return kept, taken(newest, replaced.column(ROW))
