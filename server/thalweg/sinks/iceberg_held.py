"""What an Iceberg sink's tables hold, read back from the catalog (``Sink.holds``).

Per table: its coverage from its snapshot summaries (a routed sink's from its control
table, ``sinks/iceberg_routes.py``) and the locator columns of its rows. Read-only: an
embedded SQL catalog that was never created is not created by looking.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchTableError

from thalweg.sinks import iceberg_routes, routes
from thalweg.sinks.base import Ranges
from thalweg.sinks.contract import Held
from thalweg.sinks.iceberg_coverage import table_coverage

if TYPE_CHECKING:
    from thalweg.sinks.iceberg import IcebergSink


def read_held(sink: IcebergSink, wanted: list[str]) -> Held:
    """Each table's coverage from its snapshot summaries (a routed sink's from its
    control table) and the ``wanted`` columns of its rows. An embedded SQL catalog
    never created is not created here: it holds nothing."""

    props = sink.catalog_properties()
    uri = str(props.get("uri", ""))
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return Held({}, dict.fromkeys(sink.cfg.topics))
    catalog = load_catalog(sink.name, **props)
    coverage: Ranges = {}
    rows: dict[str, pa.Table | None] = {}
    ns, template = sink.cfg.namespace, sink.cfg.table
    routed = routes.routed(template)
    if routed:  # the control record, and every table the template names
        record = iceberg_routes.control(catalog, ns, create=False)
        found = {} if record is None else table_coverage(record, sink.name)
        coverage.update({k: v for k, v in found.items() if k[0] in sink.cfg.topics})
    for topic in sink.cfg.topics:
        idents = (
            [f"{ns}.{n}" for n in iceberg_routes.tables_of(catalog, ns, template, topic)]
            if routed
            else [sink.identifier(topic)]
        )
        parts = []
        for ident in idents:
            try:
                table = catalog.load_table(ident)
            except NoSuchTableError:
                continue
            if not routed:
                own = table_coverage(table, sink.name)
                coverage.update({k: v for k, v in own.items() if k[0] == topic})
            names = {f.name for f in table.schema().fields}
            picked = tuple(c for c in wanted if c in names)
            parts.append(table.scan(selected_fields=picked).to_arrow())
        rows[topic] = pa.concat_tables(parts, promote_options="permissive") if parts else None
    return Held(coverage, rows)
