"""``routes.not_held``: the rows of a replayed flush a routed table already
holds (its own coverage, for the flush's partition and epoch) are left out, the rest
kept — by range, per partition."""

from __future__ import annotations

import pyarrow as pa

from thalweg.records.columns import MetadataColumns
from thalweg.sinks.routes import not_held

COLS = MetadataColumns()


def test_rows_inside_the_tables_own_coverage_of_the_flushs_keys_are_left_out() -> None:
    rows = pa.table(
        {
            "_twg_source_partition": pa.array([0, 0, 0, 1, 1, 1], pa.int32()),
            "_twg_position": pa.array([4, 5, 9, 4, 5, 9], pa.int64()),
        }
    )
    covered = {("t", 0, 0): [(4, 10)], ("t", 1, 2): [(4, 10)]}
    own = {
        ("t", 0, 0): [(0, 5), (9, 10)],  # holds 4 and 9 of partition 0
        ("t", 1, 1): [(0, 10)],  # another epoch of partition 1: not this flush's
        ("t", 1, 2): [(5, 6)],  # holds 5 of partition 1
        ("u", 0, 0): [(0, 100)],  # another topic
    }
    kept = not_held(rows, own, covered, "t", COLS)
    assert list(zip(*kept.to_pydict().values(), strict=True)) == [(0, 5), (1, 4), (1, 9)]
    assert not_held(rows, {}, covered, "t", COLS).equals(rows)


def test_a_flush_across_an_epoch_change_keeps_the_new_epochs_rows() -> None:
    """The table holds epoch 0 up to 100; the flush covers epoch 0's 90-100 (held) and
    epoch 1's 0-20 (new, the broker started again at 0): only 90-99 are left out."""
    rows = pa.table(
        {
            "_twg_source_partition": pa.array([0] * 4, pa.int32()),
            "_twg_position": pa.array([95, 99, 3, 19], pa.int64()),
        }
    )
    covered = {("t", 0, 0): [(90, 100)], ("t", 0, 1): [(0, 20)]}
    own = {("t", 0, 0): [(0, 100)]}
    assert not_held(rows, own, covered, "t", COLS)["_twg_position"].to_pylist() == [3, 19]
