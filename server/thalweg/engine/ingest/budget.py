"""What the pipeline can absorb before the next fetch, in records, bytes and time.

The byte budget is what ``raw_lane.max_buffered_bytes`` still allows; it becomes a
record count through an estimate of the p95 record size, seeded by the source's
``record_size_est_bytes`` and then learnt from every fetch (a moving average of each
fetch's p95 over all its partitions, so one odd fetch does not swing it). Sizing by the
p95 rather than the mean keeps a fetch of mostly-large records from overshooting the
bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True, slots=True)
class Budget:
    """One poll's allowance; ``max_records`` is at least 1 so a poll always makes
    progress (the pause/resume bound, not the budget, stops fetching)."""

    max_records: int
    max_bytes: int
    deadline_ms: int


class SizeEstimator:
    """Moving estimate of the p95 record size (key + value bytes)."""

    def __init__(self, seed_bytes: int, weight: float = 0.2) -> None:
        self.p95 = float(max(1, seed_bytes))
        self._weight = weight

    def observe(self, values: pa.Array | pa.ChunkedArray, keys: pa.Array | pa.ChunkedArray) -> None:
        if len(values) == 0:
            return
        sizes = pc.add(
            pc.fill_null(pc.binary_length(values), 0), pc.fill_null(pc.binary_length(keys), 0)
        )
        p95 = float(np.percentile(np.asarray(sizes), 95))
        self.p95 += self._weight * (max(1.0, p95) - self.p95)


def budget_for(
    free_bytes: int, estimator: SizeEstimator, max_poll_records: int, deadline_ms: int
) -> Budget:
    free = max(0, free_bytes)
    records = int(free // estimator.p95)
    return Budget(max(1, min(max_poll_records, records)), free, deadline_ms)
