"""A follow stream's lag limit counts records, not positions: Pulsar positions are
sparse (an unbatched message moves the position by 2**13), so a position difference
would end a healthy follower's stream."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.lane.test_lane import COLS, raw, writer
from thalweg.flight.read.stream import FollowLagError, _check_lag
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.lane.read.live import LiveTail

STEP = 1 << 13  # one unbatched Pulsar message


def catalog_with_sparse_history(tmp_path: Path) -> LaneCatalog:
    layout, w = writer(tmp_path)
    first = [i * STEP for i in range(100)]
    second = [i * STEP for i in range(100, 400)]
    w.write("t", 0, raw(first), None, 0, first[-1] + 1)
    w.write("t", 0, raw(second), None, first[-1] + 1, second[-1] + 1)
    return LaneCatalog(layout, COLS, LiveTail())


def test_a_follower_300_records_behind_is_within_a_1000_record_limit(tmp_path: Path) -> None:
    catalog = catalog_with_sparse_history(tmp_path)
    pos = 100 * STEP  # the first segment was sent; 300 records (2.4 M positions) remain
    assert catalog.durable_end("t", 0) - pos > 1000
    _check_lag(catalog, "t", 0, pos, 1000, {0}, {0: pos})  # no error


def test_a_follower_past_the_limit_in_records_is_stopped(tmp_path: Path) -> None:
    catalog = catalog_with_sparse_history(tmp_path)
    pos = 100 * STEP
    with pytest.raises(FollowLagError, match="fell 300 records behind"):
        _check_lag(catalog, "t", 0, pos, 200, {0}, {0: pos})
