"""A table's docs from its topic's contract (``recovery/table_docs.py``,
``sinks/table_docs.py``), and their sync writing nothing when the table agrees already
(``sinks/delta_docs.py``, ``sinks/iceberg_tables.describe``) — on local tables."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import yaml

from thalweg.contracts.model import DataContract
from thalweg.recovery.table_docs import of_contract
from thalweg.sinks import delta_docs
from thalweg.sinks.iceberg_tables import create_table, describe
from thalweg.sinks.table_docs import TableDocs, split_tag

CONTRACT = """
apiVersion: v3.0.2
kind: DataContract
id: c1
version: 2.0.0
tags: [pii, "tier:gold"]
schema:
  - name: orders
    physicalName: shop.orders
    description: Orders placed
    tags: ["domain=sales"]
    customProperties:
      - {property: owner, value: team-a}
    properties:
      - {name: n, logicalType: integer, description: The order number}
      - {name: city, logicalType: string}
"""

DOCS = TableDocs(
    description="Orders placed",
    columns={"n": "The order number"},
    properties={"owner": "team-a"},
    tags={"pii": ""},
)
ROWS = pa.table({"n": pa.array([1, 2], pa.int64()), "city": ["a", "b"]})


def test_a_contract_names_the_tables_description_comments_properties_and_tags() -> None:
    docs = of_contract(DataContract.model_validate(yaml.safe_load(CONTRACT)), "shop.orders")
    assert docs.description == "Orders placed"
    assert docs.columns == {"n": "The order number"}  # city says nothing
    assert docs.table_properties() == {
        "owner": "team-a",
        "thalweg.contract.id": "c1",
        "thalweg.contract.version": "2.0.0",
        "thalweg.tag.pii": "",
        "thalweg.tag.tier": "gold",
        "thalweg.tag.domain": "sales",
    }
    assert not of_contract(DataContract.model_validate({"apiVersion": "v3", "kind": "x"}), "t")
    assert split_tag(" a = b ") == ("a", "b") and split_tag("plain") == ("plain", "")


def test_a_schemas_own_doc_is_the_comment_the_contract_does_not_give() -> None:
    schema = pa.schema([pa.field("city", pa.string(), metadata={b"doc": b"from avro"})])
    assert DOCS.comments(schema) == {"city": "from avro"}
    assert TableDocs(columns={"city": "contract"}).comments(schema) == {"city": "contract"}


def test_a_delta_tables_docs_are_written_once_and_then_agree(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(str(tmp_path / "t"), ROWS)
    table = DeltaTable(str(tmp_path / "t"))
    assert delta_docs.describe(table, DOCS, ROWS.schema) == 3  # description, props, n
    table = DeltaTable(str(tmp_path / "t"))
    version = table.version()
    assert delta_docs.describe(table, DOCS, ROWS.schema) == 0
    assert DeltaTable(str(tmp_path / "t")).version() == version
    assert table.metadata().configuration["thalweg.tag.pii"] == ""


def test_an_iceberg_table_is_made_with_its_docs_and_then_agrees(tmp_path: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=tmp_path.as_uri())
    catalog.create_namespace("ns")
    table, made = create_table(catalog, "ns.t", ROWS.schema, [], DOCS)
    assert made and table.schema().find_field("n").doc == "The order number"
    assert table.properties["comment"] == "Orders placed"
    assert table.properties["thalweg.tag.pii"] == ""
    before = table.metadata_location
    assert describe(table, DOCS, ROWS.schema) is False  # made with them: nothing to write
    assert catalog.load_table("ns.t").metadata_location == before
    edited = TableDocs(description="Orders", columns={"city": "The city"})
    assert describe(table, edited, ROWS.schema) is True
    again = catalog.load_table("ns.t")
    assert again.schema().find_field("city").doc == "The city"
    assert again.properties["comment"] == "Orders"


def test_without_a_contract_a_schemas_own_doc_still_becomes_the_comment(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake
    from pyiceberg.catalog.sql import SqlCatalog

    from thalweg.sinks.table_docs import NONE

    i = ROWS.schema.get_field_index("city")
    schema = ROWS.schema.set(i, ROWS.schema.field(i).with_metadata({b"doc": b"From Avro"}))
    assert NONE.speaks_of(schema) and not NONE.speaks_of(ROWS.schema)
    write_deltalake(str(tmp_path / "d"), ROWS)
    assert delta_docs.describe(DeltaTable(str(tmp_path / "d")), NONE, schema) == 1
    fields = {f.name: f.metadata for f in DeltaTable(str(tmp_path / "d")).schema().fields}
    assert fields["city"] == {"comment": "From Avro"}
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=tmp_path.as_uri())
    catalog.create_namespace("ns")
    table, _ = create_table(catalog, "ns.t", ROWS.schema, [])
    describe(table, NONE, schema)
    assert catalog.load_table("ns.t").schema().find_field("city").doc == "From Avro"
