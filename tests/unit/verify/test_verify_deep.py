"""``--deep``'s comparison of one record, and its plan bounded by ``--since``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.helpers import write_segment
from thalweg.lane.layout import LaneLayout
from thalweg.records.columns import MetadataColumns
from thalweg.verify.deep import broker_fields, differing, plan_range


def test_each_field_that_differs_is_named_and_a_null_key_is_not_an_empty_one() -> None:
    sent = SimpleNamespace(key=None, value=b"v", headers=[("h", b"1"), ("h", None)], timestamp=5)
    held = broker_fields(sent)
    assert held == (None, b"v", ((b"h", b"1"), (b"h", None)), 5)
    assert differing(held, held) == ()
    assert differing((b"", b"v", held[2], 5), held) == ("key",)
    assert differing((None, b"w", ((b"h", b"1"),), 6), held) == ("value", "headers", "timestamp")
    # The headers' order is the record's: the same pairs swapped differ.
    assert differing((None, b"v", ((b"h", None), (b"h", b"1")), 5), held) == ("headers",)
    # A record without a timestamp (-1 on the wire) against a lane's null or -1: equal.
    unstamped = broker_fields(SimpleNamespace(key=b"k", value=None, headers=(), timestamp=-1))
    assert differing((b"k", None, (), None), unstamped) == ()
    assert differing((b"k", None, (), -1), unstamped) == ()


def test_since_skips_the_segments_whose_records_are_all_older(tmp_path: Path) -> None:
    # write_segment stamps every record at timestamp 0: all older than any --since.
    write_segment(tmp_path, "t", 0, range(0, 10), 0)
    write_segment(tmp_path, "t", 0, range(10, 20), 10)
    layout, cols = LaneLayout(tmp_path), MetadataColumns()
    whole = plan_range(layout, cols, "t", 0, (0, 20), None)
    assert whole is not None
    assert (whole.start, whole.end, len(whole.segments)) == (0, 20, 2)
    cut = plan_range(layout, cols, "t", 0, (5, 20), None)
    assert cut is not None and cut.start == 5
    assert plan_range(layout, cols, "t", 0, (0, 20), 1) is None
    assert plan_range(layout, cols, "t", 0, (0, 20), 0) == whole
