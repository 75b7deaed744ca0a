"""Secondary sinks fed from the raw lane: the coverage store (which positions each sink
holds) and the feeder that fills every gap — the live edge and a replay alike."""

from __future__ import annotations

from thalweg.recovery.coverage import CoverageStore
from thalweg.recovery.feeder import PassSummary, SinkFeeder

__all__ = ["CoverageStore", "PassSummary", "SinkFeeder"]
