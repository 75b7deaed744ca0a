"""Recovery of secondary sinks from the raw lane: the coverage store (which positions
each sink holds) — the replay from raw that fills a sink's gaps is not built yet."""

from __future__ import annotations

from thalweg.recovery.coverage import CoverageStore

__all__ = ["CoverageStore"]
