"""Sidecar transforms: the gateway as a Flight ``do_exchange`` client (``docs/sidecars.md``).

The only place the gateway calls out to a transform; ``thalweg.pipeline`` stays free of
Flight and receives a sidecar as a function of a table.
"""

from __future__ import annotations

from thalweg.sidecars.client import (
    SidecarClient,
    SidecarContractError,
    SidecarRefusedError,
    SidecarUnavailableError,
)

__all__ = [
    "SidecarClient",
    "SidecarContractError",
    "SidecarRefusedError",
    "SidecarUnavailableError",
]
