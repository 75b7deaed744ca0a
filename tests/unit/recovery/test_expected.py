"""What a destination should hold, from the lane (``recovery.expected``): the answer
verify and the feeder's recheck share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.helpers import write_segment
from thalweg.lane import LaneLayout
from thalweg.lane.layout import Lane
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.expected import as_ranges, inside, lane_positions


def test_runs_of_positions_become_half_open_ranges() -> None:
    assert as_ranges(np.array([3, 4, 5, 9, 11, 12], np.int64)) == [(3, 6), (9, 10), (11, 13)]
    assert as_ranges(np.array([7], np.int64)) == [(7, 8)]
    assert as_ranges(np.zeros(0, np.int64)) == []


def test_inside_keeps_only_positions_in_the_ranges() -> None:
    got = inside(np.arange(10, dtype=np.int64), [(2, 4), (8, 20)])
    assert got.tolist() == [2, 3, 8, 9]


def test_lane_positions_are_the_decoded_rows_in_the_window_less_decode_failures(
    tmp_path: Path,
) -> None:
    write_segment(tmp_path, "t", 0, range(0, 10), 0)
    write_segment(tmp_path, "t", 0, range(10, 20), 10)
    layout, cols = LaneLayout(tmp_path), MetadataColumns()
    assert lane_positions(layout, cols, "t", 0, [(5, 12)], raw=False).tolist() == list(range(5, 12))
    # A failed decode holds no row for a decoded sink; a raw sink still gets it.
    twin = (
        layout.partition_dir(Lane.DECODED, "t", 0) / layout.segments(Lane.RAW, "t", 0)[1].path.name
    )
    table = pq.read_table(twin)
    errors = pa.array(
        [("bad" if p == 11 else None) for p in table.column(cols.position).to_pylist()], pa.string()
    )
    table = table.set_column(
        table.schema.get_field_index(cols.decode_error), cols.decode_error, errors
    )
    pq.write_table(table, twin)
    assert 11 not in lane_positions(layout, cols, "t", 0, [(0, 20)], raw=False).tolist()
    assert lane_positions(layout, cols, "t", 0, [(0, 20)], raw=True).tolist() == list(range(20))
    # A missing twin: which of its records decoded is not known, so none is expected.
    twin.unlink()
    assert lane_positions(layout, cols, "t", 0, [(0, 20)], raw=False).tolist() == list(range(10))
