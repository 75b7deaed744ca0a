"""Schema registries: where writer schemas come from.

``ConfluentRegistry`` speaks the Confluent REST API (I/O; call it off the event loop);
``StaticRegistry`` reads ``<id>.avsc`` files. Both cache forever: a schema id never
changes meaning.
"""

from __future__ import annotations

from thalweg.registry.confluent import ConfluentRegistry
from thalweg.registry.errors import RegistryError, RegistryUnavailableError
from thalweg.registry.static import StaticRegistry

__all__ = ["ConfluentRegistry", "RegistryError", "RegistryUnavailableError", "StaticRegistry"]
