"""Protobuf schemas for the decoder: from a registry (compiled once) or a file."""

from __future__ import annotations

from pathlib import Path

from thalweg.codecs.protobuf import ProtoSchema
from thalweg.registry.confluent import ConfluentRegistry
from thalweg.registry.errors import RegistryError
from thalweg.registry.protoc import compile_proto


class RegistryProtoSchemas:
    """Schemas by id from a Confluent registry (``schemaType`` PROTOBUF)."""

    def __init__(self, registry: ConfluentRegistry) -> None:
        self._registry = registry
        self._compiled: dict[int, ProtoSchema] = {}

    def get(self, schema_id: int) -> ProtoSchema | None:
        return self._compiled.get(schema_id)

    def fetch(self, schema_id: int) -> ProtoSchema | None:
        if schema_id in self._compiled:
            return self._compiled[schema_id]
        raw = self._registry.fetch_raw(schema_id)
        if raw is None:
            return None
        kind, text = raw
        if kind != "PROTOBUF":
            raise RegistryError(f"schema id {schema_id} is {kind}, not Protobuf")
        schema = ProtoSchema(compile_proto(text))
        self._compiled[schema_id] = schema
        return schema


class FileProtoSchemas:
    """One descriptor-set file for every schema id (``protoc --descriptor_set_out``)."""

    def __init__(self, path: Path) -> None:
        try:
            self._schema = ProtoSchema(Path(path).read_bytes())
        except OSError as exc:
            raise RegistryError(f"{path}: cannot read the descriptor set: {exc}") from exc

    def get(self, schema_id: int) -> ProtoSchema | None:
        return self._schema

    def fetch(self, schema_id: int) -> ProtoSchema | None:
        return self._schema
