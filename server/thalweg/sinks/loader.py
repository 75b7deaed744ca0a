"""Sinks by ``kind``: a name → loader table, so a deployment imports only the backends
it configures, and a missing backend package is named with its install hint
(pyiceberg's ``load_hive`` pattern)."""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

from thalweg.errors import ConfigError
from thalweg.sinks.base import Sink


class _Entry(NamedTuple):
    target: str  # "module:Class"
    extra: str | None  # the pip extra that brings the backend's packages
    built: bool  # False: planned, not built yet


# The destinations of issue 15. A kind not built yet is refused with that message,
# never half-served.
SINKS: dict[str, _Entry] = {
    "iceberg": _Entry("thalweg.sinks.iceberg:IcebergSink", "iceberg", built=True),
    "postgres": _Entry("thalweg.sinks.postgres:PostgresSink", "postgres", built=True),
    "arrow_ipc": _Entry("thalweg.sinks.arrow_ipc:ArrowIpcSink", None, built=True),
    "flight": _Entry("thalweg.sinks.flight:FlightSink", None, built=True),
    "delta": _Entry("thalweg.sinks.delta:DeltaSink", "delta", built=True),
}


def load_sink_class(kind: str) -> type[Sink[Any]]:
    """The sink class for ``kind`` (imported on first use).

    Raises:
        ConfigError: an unknown kind (the known ones listed), a kind not built yet, or
            a backend whose package is not installed (with the ``pip install`` hint).
    """
    entry = SINKS.get(kind)
    if entry is None:
        raise ConfigError(f"unknown sink kind {kind!r}; known: {', '.join(sorted(SINKS))}")
    if not entry.built:
        raise ConfigError(f"sinks of kind {kind!r} are not built yet (docs/status.md)")
    module, _, name = entry.target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        if exc.name is not None and exc.name.startswith("thalweg"):
            raise
        hint = f": pip install 'thalweg[{entry.extra}]'" if entry.extra else ""
        raise ConfigError(
            f"sinks of kind {kind!r} need a package that is not installed ({exc.name}){hint}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Sink)):
        raise ConfigError(f"{entry.target} is not a Sink")
    return cls
