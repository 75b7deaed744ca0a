"""The part of the Open Data Contract Standard (ODCS v3) that Thalweg reads.

A contract is YAML owned by the data producer; Thalweg enforces what can be decided one
record at a time (ADR 0016). The models accept every other ODCS field untouched
(``extra = "allow"``): a contract written for a catalogue or for Soda loads here too,
and what Thalweg does not enforce is listed, never silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from thalweg.errors import ConfigError

LOGICAL_TYPES = (
    "string",
    "integer",
    "number",
    "boolean",
    "date",
    "timestamp",
    "time",
    "object",
    "array",
)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)


class QualityRule(_Open):
    """One entry of a ``quality`` list (ODCS "data quality")."""

    name: str | None = None
    type: str = "library"  # library | sql | custom | text
    metric: str | None = None  # ODCS 3.1 library metric
    rule: str | None = None  # ODCS 3.0 spelling of the same
    arguments: dict[str, Any] = Field(default_factory=dict)
    must_be: Any = Field(None, alias="mustBe")
    engine: str | None = None
    implementation: Any = None
    query: str | None = None
    description: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.metric or self.rule or self.type

    def thresholds(self) -> dict[str, Any]:
        """Every ``mustBe*`` / ``mustNotBe*`` key the rule sets."""
        extra = self.model_extra or {}
        found = {k: v for k, v in extra.items() if k.startswith(("mustBe", "mustNotBe"))}
        if self.must_be is not None:
            found["mustBe"] = self.must_be
        return found


class Property(_Open):
    """A field of the payload (ODCS "property")."""

    name: str
    logical_type: str | None = Field(None, alias="logicalType")
    logical_type_options: dict[str, Any] = Field(default_factory=dict, alias="logicalTypeOptions")
    required: bool = False
    quality: list[QualityRule] = Field(default_factory=list)
    properties: list[Property] = Field(default_factory=list)


class SchemaObject(_Open):
    """One object of the contract: for Thalweg, the records of one topic."""

    name: str
    physical_name: str | None = Field(None, alias="physicalName")
    properties: list[Property] = Field(default_factory=list)
    quality: list[QualityRule] = Field(default_factory=list)


class DataContract(_Open):
    """A whole ODCS document."""

    api_version: str = Field(alias="apiVersion")
    kind: str
    id: str | None = None
    version: str | None = None
    schema_: list[SchemaObject] = Field(default_factory=list, alias="schema")

    def object_for(self, topic: str) -> SchemaObject | None:
        """The object that describes ``topic``: the one whose ``physicalName`` (or, if
        none has it, whose ``name``) is the topic; a contract with one object applies
        to every topic of the source."""
        for obj in self.schema_:
            if obj.physical_name == topic:
                return obj
        for obj in self.schema_:
            if obj.physical_name is None and obj.name == topic:
                return obj
        return self.schema_[0] if len(self.schema_) == 1 else None


def load_contract(path: Path) -> DataContract:
    """Read and check an ODCS YAML (or JSON) file.

    Raises:
        ConfigError: unreadable, not YAML, not a v3 ``DataContract``, or a property whose
            ``logicalType`` ODCS does not define.
    """
    try:
        doc = yaml.safe_load(path.read_text("utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"contract {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"contract {path}: not a YAML mapping")
    try:
        contract = DataContract.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"contract {path}: {where}: {first['msg']}") from exc
    if contract.kind != "DataContract":
        raise ConfigError(f"contract {path}: kind is {contract.kind!r}, not 'DataContract'")
    if not str(contract.api_version).lstrip("v").startswith("3."):
        raise ConfigError(
            f"contract {path}: apiVersion {contract.api_version!r}: ODCS v3 is supported"
        )
    if not contract.schema_:
        raise ConfigError(f"contract {path}: no schema objects")
    for obj in contract.schema_:
        for prop in obj.properties:
            if prop.logical_type is not None and prop.logical_type not in LOGICAL_TYPES:
                raise ConfigError(
                    f"contract {path}: {obj.name}.{prop.name}: logicalType "
                    f"{prop.logical_type!r} is not one of {', '.join(LOGICAL_TYPES)}"
                )
    return contract
