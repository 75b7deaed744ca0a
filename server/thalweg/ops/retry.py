"""Exponential backoff with full jitter, for retriable failures only.

Every retry is counted (``twg_retries_total{stage}``) so an operator sees a broker or a
disk flapping before it becomes an outage. Jitter matters when many partitions (or many
gateways) fail together: without it they all retry in the same instant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class Backoff:
    """Delays ``base * 2**n``, capped at ``cap``, each drawn uniformly from ``[0, d]``
    ("full jitter", which spreads retries best for the same mean wait).

    ``attempts`` counts the waits so far; ``reset`` after a success.
    """

    base_s: float = 0.2
    cap_s: float = 5.0
    attempts: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next_delay(self) -> float:
        ceiling = min(self.cap_s, self.base_s * (2**self.attempts))
        self.attempts += 1
        # Never below a tenth of the ceiling: a zero wait would be a hot loop.
        return self.rng.uniform(ceiling / 10, ceiling)

    def reset(self) -> None:
        self.attempts = 0

    async def wait(self, stop: asyncio.Event | None = None) -> float:
        """Sleep the next delay (returning early when ``stop`` is set); the delay."""
        delay = self.next_delay()
        if stop is None:
            await asyncio.sleep(delay)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        return delay
