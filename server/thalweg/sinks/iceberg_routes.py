"""One topic into many Iceberg tables (``table = "{tenant}_orders"``, docs/cdc.md).

Iceberg commits one table at a time, so a flush whose rows go to several tables cannot
land them and its coverage in one commit. It lands in two steps instead:

1. each table the rows name, in turn, in one commit of its own that appends the rows
   and adds the flush's ranges to **that table's** coverage (``thalweg.coverage.<sink>``,
   as an unrouted table keeps it) — read as "every row of these ranges that names this
   table is here";
2. then the ranges, in the sink's **control record**: the properties of an empty table
   ``<namespace>._thalweg_coverage`` — "every row of these ranges is in its table".

The sink's coverage is the control record. A crash between the steps leaves the flush
uncovered, so it is replayed from the lane; a table that already committed it finds the
ranges in its own coverage and leaves those rows out (``routes.not_held``), the others
take theirs, and the control record catches up. Nothing lands twice, nothing is lost,
and a control record that is lost only costs a replay of what the lane still holds.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.table import Table

from thalweg.errors import InvariantError
from thalweg.records.ranges import merge_ranges
from thalweg.sinks import routes
from thalweg.sinks.base import Ranges
from thalweg.sinks.iceberg_coverage import COVERAGE_PREFIX, encode_coverage, table_coverage

CONTROL = routes.RESERVED  # the control table: a name no route may take
_TRIES = 5


def tables_of(catalog: Catalog, namespace: str, template: str, topic: str) -> list[str]:
    """The tables in ``namespace`` that ``template`` can name for ``topic``."""
    like = routes.pattern(template, topic)
    names = (ident[-1] for ident in catalog.list_tables(namespace))
    return sorted(n for n in names if n != CONTROL and like.match(n))


def opened(catalog: Catalog, cfg: Any) -> tuple[set[str], Ranges]:
    """A routed sink's tables as they exist, and its coverage (the control record)."""
    ns, template, topics = cfg.namespace, cfg.table, cfg.topics
    tables = {n for t in topics for n in tables_of(catalog, ns, template, t)}
    record = control(catalog, ns, create=False)
    found = {} if record is None else table_coverage(record, cfg.name)
    return tables, {k: v for k, v in found.items() if k[0] in topics}


def control(catalog: Catalog, namespace: str, *, create: bool) -> Table | None:
    """The sink's control table (made when ``create`` and missing)."""
    ident = f"{namespace}.{CONTROL}"
    try:
        return catalog.load_table(ident)
    except NoSuchTableError:
        if not create:
            return None
    try:
        return catalog.create_table(ident, schema=pa.schema([pa.field("unused", pa.int32())]))
    except TableAlreadyExistsError:  # another gateway made it meanwhile
        return catalog.load_table(ident)


def cover(catalog: Catalog, namespace: str, sink: str, covered: Ranges) -> None:
    """Add ``covered`` to the sink's control record, retried over other writers'
    commits (each try merges into what the table holds then)."""
    table = control(catalog, namespace, create=True)
    if table is None:
        raise InvariantError("the control table was made if missing")
    for attempt in range(_TRIES):
        merged = table_coverage(table, sink)
        for key, rs in covered.items():
            merged[key] = merge_ranges([*merged.get(key, []), *rs])
        try:
            with table.transaction() as tx:
                tx.set_properties({COVERAGE_PREFIX + sink: encode_coverage(merged)})
            return
        except CommitFailedException:
            if attempt == _TRIES - 1:
                raise
            table = catalog.load_table(f"{namespace}.{CONTROL}")
