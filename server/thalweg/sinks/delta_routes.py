"""One topic into many Delta tables (``table = "{tenant}_orders"``, docs/cdc.md), as
Iceberg does it (``sinks/iceberg_routes.py``).

Delta commits one table at a time, so a flush whose rows go to several tables lands in
two steps:

1. each table the rows name, in turn, in one commit that appends (or merges) the rows
   and records the flush's ranges in **that table's** coverage — read as "every row of
   these ranges that names this table is here";
2. then the ranges, and the names of the sink's tables, in the sink's **control
   record**: the commits of a table with no rows, ``<uri>/_thalweg_coverage``.

The sink's coverage is the control record. A crash between the steps leaves the flush
uncovered, so it is replayed; a table that already committed it finds the ranges in its
own coverage and leaves those rows out (``routes.not_held``), the others take theirs,
and the control record catches up. The table names live in the control record, not in
a listing of the bucket: a table made by a flush cut before its control commit is named
again by that flush's replay.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from thalweg.records.ranges import merge_ranges
from thalweg.sinks import delta_log, routes
from thalweg.sinks.base import Ranges
from thalweg.sinks.coverage_json import COVERAGE_PREFIX, encode_coverage

CONTROL = routes.RESERVED  # the control table's directory: a name no route may take
_SCHEMA = pa.schema([pa.field("unused", pa.int32())])


def load(uri: str, options: dict[str, str]) -> Any:
    """The Delta table at ``uri`` now, or None before its first commit (or dropped)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(uri, storage_options=options)
    except TableNotFoundError:
        return None


def opened(
    base: str, sink: str, topics: list[str], options: dict[str, str]
) -> tuple[set[str], Ranges]:
    """A routed sink's tables and its coverage (the control record's)."""
    control = load(f"{base}/{CONTROL}", options)
    if control is None:
        return set(), {}
    found = delta_log.coverage(control, sink)
    return delta_log.tables(control, sink), {k: v for k, v in found.items() if k[0] in topics}


def cover(base: str, sink: str, covered: Ranges, tables: set[str], options: dict[str, str]) -> None:
    """Add ``covered`` to the control record, naming ``tables`` (one commit, no rows).
    One feeder feeds a sink, so the commit merges into what the record held at open."""
    from deltalake import CommitProperties, write_deltalake

    uri = f"{base}/{CONTROL}"
    control = load(uri, options)
    merged = {} if control is None else delta_log.coverage(control, sink)
    for key, rs in covered.items():
        merged[key] = merge_ranges([*merged.get(key, []), *rs])
    props = CommitProperties(
        custom_metadata={
            COVERAGE_PREFIX + sink: encode_coverage(merged),
            delta_log.TABLES_PREFIX + sink: json.dumps(sorted(tables)),
        }
    )
    write_deltalake(
        control if control is not None else uri,
        _SCHEMA.empty_table(),
        mode="append",
        storage_options=None if control is not None else options,
        commit_properties=props,
    )
