"""What a table says about itself (ADR 0042): a description, column comments, table
properties and tags — taken from the topic's data contract, written when a sink makes a
table and synced again whenever they differ from what the table says (a contract edited,
a column added), so a catalogue (Glue, Unity, a REST catalog's UI, ``\\d+`` in psql)
shows what the producer wrote about the data, not only its types.

The contract is the ODCS document of the topic's source (``sources[].contract``): its
object's ``description`` describes the table, each property's ``description`` its
column, the object's ``customProperties`` become table properties, and the contract's
and the object's ``tags`` become properties ``thalweg.tag.<key>`` (a tag ``k=v`` or
``k:v`` has that value, a plain tag ``""``) — and, on Glue, the table's resource tags.
A column the contract says nothing of keeps the doc its schema gave it (an Arrow field's
``doc`` metadata, as pyiceberg names it), if any.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa

DOC_KEY = b"doc"  # an Arrow field's description (pyiceberg's PYARROW_FIELD_DOC_KEY)
TAG_PREFIX = "thalweg.tag."


@dataclass(frozen=True, slots=True)
class TableDocs:
    """What one topic's table should say about itself."""

    description: str | None = None
    columns: Mapping[str, str] = field(default_factory=dict)  # column → comment
    properties: Mapping[str, str] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)

    def comments(self, schema: pa.Schema) -> dict[str, str]:
        """The comment of each column of ``schema`` that has one: the contract's, else
        the field's own doc."""
        out = {}
        for f in schema:
            own = (f.metadata or {}).get(DOC_KEY)
            text = self.columns.get(f.name) or (own.decode() if own else None)
            if text:
                out[f.name] = text
        return out

    def table_properties(self) -> dict[str, str]:
        """The table's properties: the contract's custom ones and a ``thalweg.tag.*``
        per tag."""
        return {**self.properties, **{TAG_PREFIX + k: v for k, v in self.tags.items()}}

    def with_docs(self, schema: pa.Schema) -> pa.Schema:
        """``schema`` with each column's comment as its field's doc (how a table is
        made with its comments in one step)."""
        comments = self.comments(schema)
        fields = [
            f.with_metadata({**(f.metadata or {}), DOC_KEY: comments[f.name].encode()})
            if f.name in comments
            else f
            for f in schema
        ]
        return pa.schema(fields, metadata=schema.metadata)

    def speaks_of(self, schema: pa.Schema) -> bool:
        """Whether a table of ``schema`` has anything to say: these docs, or a field's
        own doc (an Avro field's, without a contract)."""
        return bool(self) or any(DOC_KEY in (f.metadata or {}) for f in schema)

    def __bool__(self) -> bool:
        return bool(self.description or self.columns or self.properties or self.tags)


NONE = TableDocs()


def split_tag(tag: str) -> tuple[str, str]:
    """``"k=v"`` or ``"k:v"`` → (k, v); a plain tag → (tag, "")."""
    for sep in ("=", ":"):
        if sep in tag:
            key, _, value = tag.partition(sep)
            return key.strip(), value.strip()
    return tag.strip(), ""
