"""Build the registry a source's configuration asks for."""

from __future__ import annotations

import ssl

from thalweg.config.models import RegistryConfig
from thalweg.registry.confluent import ConfluentRegistry
from thalweg.registry.static import StaticRegistry


def open_registry(cfg: RegistryConfig) -> ConfluentRegistry | StaticRegistry:
    if cfg.schemas_dir is not None:
        return StaticRegistry(cfg.schemas_dir)
    assert cfg.url is not None
    context = ssl.create_default_context(cafile=str(cfg.ssl_cafile)) if cfg.ssl_cafile else None
    return ConfluentRegistry(
        cfg.url,
        username=cfg.username,
        password=cfg.password.get_secret_value() if cfg.password else None,
        token=cfg.token.get_secret_value() if cfg.token else None,
        ssl_context=context,
        timeout_s=cfg.timeout_s,
    )
