"""A Delta table's docs (ADR 0042): its description, its properties (the table's
``configuration``: the contract's properties and ``thalweg.tag.*``) and each column's
``comment`` field metadata — what Databricks' Catalog Explorer, Unity Catalog and
``DESCRIBE TABLE`` show. Each is written with delta-rs's ``alter`` only where it differs,
a commit of its own that carries no coverage (``delta_log`` steps over it)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from thalweg.sinks.table_docs import TableDocs

COMMENT = "comment"  # the field metadata key Spark and Databricks read a column's comment from


def describe(table: Any, docs: TableDocs, schema: pa.Schema) -> int:
    """Sync ``table`` (a loaded ``DeltaTable``) with ``docs`` for the columns of
    ``schema``: the number of commits it took (0: it agreed already)."""
    commits = 0
    meta = table.metadata()
    if docs.description and meta.description != docs.description:
        table.alter.set_table_description(docs.description)
        commits += 1
    have = dict(meta.configuration or {})
    changed = {k: v for k, v in docs.table_properties().items() if have.get(k) != v}
    if changed:
        table.alter.set_table_properties(changed, raise_if_not_exists=False)
        commits += 1
    fields = {f.name: f for f in table.schema().fields}
    for column, comment in docs.comments(schema).items():
        field = fields.get(column)
        if field is not None and (field.metadata or {}).get(COMMENT) != comment:
            table.alter.set_column_metadata(column, {**(field.metadata or {}), COMMENT: comment})
            commits += 1
    return commits
