"""Build the registry a source's configuration asks for."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from thalweg.config.models import RegistryConfig, SourceConfig
from thalweg.errors import ConfigError, InvariantError
from thalweg.registry.confluent import ConfluentRegistry

if TYPE_CHECKING:
    from thalweg.registry.proto_lookup import FileProtoSchemas, RegistryProtoSchemas
from thalweg.registry.static import StaticRegistry


def open_proto_schemas(cfg: SourceConfig) -> RegistryProtoSchemas | FileProtoSchemas:
    """Protobuf schemas for ``format = "protobuf"``: a descriptor-set file or a registry."""
    try:
        from thalweg.registry.proto_lookup import FileProtoSchemas, RegistryProtoSchemas
    except ImportError as exc:
        raise ConfigError(
            f"source {cfg.name!r}: format = 'protobuf' needs the 'protobuf' extra: "
            "pip install 'thalweg[protobuf]'"
        ) from exc
    if cfg.protobuf_descriptor_set is not None:
        return FileProtoSchemas(cfg.protobuf_descriptor_set)
    if cfg.registry is None:
        raise InvariantError("cfg.registry is not set")
    registry = open_registry(cfg.registry)
    if not isinstance(registry, ConfluentRegistry):
        raise ConfigError(
            f"source {cfg.name!r}: Protobuf schemas need a registry url or a descriptor set"
        )
    return RegistryProtoSchemas(registry)


def open_registry(cfg: RegistryConfig) -> ConfluentRegistry | StaticRegistry:
    if cfg.schemas_dir is not None:
        return StaticRegistry(cfg.schemas_dir)
    if cfg.url is None:
        raise InvariantError("cfg.url is not set")
    context = ssl.create_default_context(cafile=str(cfg.ssl_cafile)) if cfg.ssl_cafile else None
    return ConfluentRegistry(
        cfg.url,
        username=cfg.username,
        password=cfg.password.get_secret_value() if cfg.password else None,
        token=cfg.token.get_secret_value() if cfg.token else None,
        ssl_context=context,
        timeout_s=cfg.timeout_s,
    )
