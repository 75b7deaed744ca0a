"""Backoff: grows exponentially, is capped, is jittered, resets."""

from __future__ import annotations

import random

from thalweg.ops.retry import Backoff


def test_delays_grow_are_capped_and_jittered() -> None:
    b = Backoff(base_s=0.1, cap_s=1.0, rng=random.Random(7))
    delays = [b.next_delay() for _ in range(12)]
    ceilings = [min(1.0, 0.1 * 2**n) for n in range(12)]
    assert all(c / 10 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert max(delays) <= 1.0
    assert len(set(delays)) == len(delays)  # jittered: no two alike
    b.reset()
    assert b.next_delay() <= 0.1


def test_two_backoffs_do_not_retry_in_lockstep() -> None:
    a, b = Backoff(rng=random.Random(1)), Backoff(rng=random.Random(2))
    assert [a.next_delay() for _ in range(5)] != [b.next_delay() for _ in range(5)]
