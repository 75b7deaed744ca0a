"""The poll budget: bytes left under the bound, turned into records by the p95 size."""

from __future__ import annotations

import pyarrow as pa

from thalweg.engine.ingest.budget import SizeEstimator, budget_for


def test_estimate_learns_the_p95_from_batches() -> None:
    est = SizeEstimator(seed_bytes=1000)
    values = pa.array([b"x" * 100] * 95 + [b"y" * 10_000] * 5)
    keys = pa.array([b"k"] * 100)
    for _ in range(40):
        est.observe(values, keys)
    # 95 % of records are 101 B, the rest 10 kB: the p95 sits between.
    assert 101 <= est.p95 <= 10_001
    assert abs(est.p95 - (101 + 0.05 * 9900)) / est.p95 < 0.5


def test_budget_shrinks_with_free_bytes_and_never_reaches_zero() -> None:
    est = SizeEstimator(seed_bytes=1000)
    assert budget_for(100 << 20, est, 10_000, 500).max_records == 10_000  # capped
    assert budget_for(1_500_000, est, 10_000, 500).max_records == 1500
    tight = budget_for(0, est, 10_000, 500)
    assert tight.max_records == 1
    assert tight.max_bytes == 0


def test_null_keys_and_values_count_as_zero_bytes() -> None:
    est = SizeEstimator(seed_bytes=50, weight=1.0)
    est.observe(pa.array([None, b"abcd"], pa.binary()), pa.array([None, None], pa.binary()))
    assert 1 <= est.p95 <= 4
