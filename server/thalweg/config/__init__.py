"""Typed configuration: pydantic models of the TOML file, loaded and validated once."""

from __future__ import annotations

from thalweg.config.load import load_config, parse_config
from thalweg.config.models import (
    GatewayConfig,
    KafkaSourceConfig,
    RawLaneConfig,
    SourceConfig,
    ThalwegConfig,
)

__all__ = [
    "GatewayConfig",
    "KafkaSourceConfig",
    "RawLaneConfig",
    "SourceConfig",
    "ThalwegConfig",
    "load_config",
    "parse_config",
]
