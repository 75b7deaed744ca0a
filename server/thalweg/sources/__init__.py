"""Transports that fetch records. Chosen by ``kind`` through a name → loader table, so a
deployment without Pulsar never imports the Pulsar client."""

from __future__ import annotations

import importlib
from typing import Any

_LOADERS = {
    "kafka": "thalweg.sources.kafka:KafkaSource",
    "pulsar": "thalweg.sources.pulsar:PulsarSource",
}


def load_source_class(kind: str) -> Any:
    """The source class for ``kind`` (imported on first use)."""
    module, _, name = _LOADERS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


__all__ = ["load_source_class"]
