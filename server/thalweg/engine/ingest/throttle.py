"""Per-source rate limits in records/s and bytes/s (aiolimiter's leaky bucket).

Admission happens after a fetch and before the next one, so a limited source holds at
most one fetch in memory while it waits; the broker keeps the rest. A batch larger than
one second's allowance is admitted in slices, so any batch size works with any rate.
"""

from __future__ import annotations

import time

from aiolimiter import AsyncLimiter


class Throttle:
    """Waits as long as the configured rates require; either limit may be unset."""

    def __init__(self, records_per_s: float | None, bytes_per_s: float | None) -> None:
        self._limits = [
            (AsyncLimiter(rate, 1.0), kind)
            for rate, kind in ((records_per_s, "records"), (bytes_per_s, "bytes"))
            if rate is not None
        ]

    @property
    def active(self) -> bool:
        return bool(self._limits)

    async def admit(self, records: int, nbytes: int) -> float:
        """Wait until ``records``/``nbytes`` fit the rates; the seconds waited."""
        started = time.perf_counter()
        for limiter, kind in self._limits:
            amount = float(records if kind == "records" else nbytes)
            while amount > 0:
                piece = min(amount, limiter.max_rate)
                await limiter.acquire(piece)
                amount -= piece
        return time.perf_counter() - started
