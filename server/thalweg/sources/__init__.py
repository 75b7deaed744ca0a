"""Transports that fetch records. Chosen by ``kind`` through a name → loader table, so a
deployment without Pulsar never imports the Pulsar client."""

from __future__ import annotations

import importlib
from typing import Any

from thalweg.errors import ConfigError

_LOADERS = {
    "kafka": "thalweg.sources.kafka:KafkaSource",
    "pulsar": "thalweg.sources.pulsar:PulsarSource",
    "files": "thalweg.sources.files.source:FileSource",
    "arrow_ipc": "thalweg.sources.files.directory:DirectorySource",
    "flight": "thalweg.sources.flight:FlightSource",
}


def load_source_class(kind: str) -> Any:
    """The source class for ``kind`` (imported on first use).

    Raises:
        ConfigError: the transport's client library is not installed.
    """
    module, _, name = _LOADERS[kind].partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ConfigError(
            f"sources of kind {kind!r} need their client library ({exc.name}): "
            f"pip install 'thalweg[{kind}]'"
        ) from exc


__all__ = ["load_source_class"]
