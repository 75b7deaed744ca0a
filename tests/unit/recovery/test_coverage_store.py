"""The coverage store: gap-aware ranges per sink and (topic, partition, epoch), durable
beside the raw lane, never claiming what was not added, and the gaps recovery works on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from thalweg.errors import ConfigError, LaneError
from thalweg.recovery import CoverageStore

K = ("orders", 0, 0)


def test_ranges_merge_and_gaps_are_what_the_lane_has_and_the_sink_does_not(
    tmp_path: Path,
) -> None:
    s = CoverageStore(tmp_path, "lake")
    s.add(K, 0, 100)
    s.add(K, 200, 300)  # out of order: a gap stays a gap
    s.add(K, 100, 150)
    s.add(K, 5, 5)  # empty: nothing
    assert s.covered(K) == [(0, 150), (200, 300)]
    assert s.gaps(K, [(0, 400)]) == [(150, 200), (300, 400)]
    assert s.gaps(K, [(0, 100), (120, 250)]) == [(150, 200)]
    assert s.gaps(("orders", 1, 0), [(0, 10)]) == [(0, 10)]
    assert s.gaps(K, [(0, 150)]) == []


def test_durable_beside_the_lane_and_never_over_claiming(tmp_path: Path) -> None:
    s = CoverageStore(tmp_path, "lake/eu")
    assert not s.flush()  # nothing to write
    s.add(K, 0, 10)
    s.add(("orders", 0, 1), 0, 3)  # a new epoch is another key
    assert s.flush()
    assert s.path.parent == tmp_path / "coverage"
    assert not [p for p in s.path.parent.iterdir() if ".tmp-" in p.name]
    s.add(K, 10, 20)  # landed after the last flush: a crash now loses only this claim
    again = CoverageStore(tmp_path, "lake/eu")
    assert again.covered(K) == [(0, 10)]
    assert again.covered(("orders", 0, 1)) == [(0, 3)]
    assert again.keys() == [K, ("orders", 0, 1)]


def test_another_sinks_file_or_a_torn_file_is_refused(tmp_path: Path) -> None:
    a = CoverageStore(tmp_path, "a")
    a.add(K, 0, 1)
    a.flush()
    os.rename(a.path, tmp_path / "coverage" / "b.json")
    with pytest.raises(LaneError, match="coverage store of 'a'"):
        CoverageStore(tmp_path, "b")
    (tmp_path / "coverage" / "c.json").write_text('{"format_version": 1, "si')
    with pytest.raises(LaneError, match="unreadable coverage store"):
        CoverageStore(tmp_path, "c")


def test_a_failed_write_keeps_the_claims_for_the_next(tmp_path: Path) -> None:
    s = CoverageStore(tmp_path, "lake")
    s.add(K, 0, 10)
    (tmp_path / "coverage").write_text("a file where the directory should be")
    with pytest.raises(LaneError, match="not written"):
        s.flush()
    (tmp_path / "coverage").unlink()
    assert s.flush()
    assert CoverageStore(tmp_path, "lake").covered(K) == [(0, 10)]


def test_one_feeder_per_sink_claims_the_store(tmp_path: Path) -> None:
    first = CoverageStore(tmp_path, "lake")
    first.claim()
    second = CoverageStore(tmp_path, "lake")
    with pytest.raises(ConfigError, match=f"already fed by pid {os.getpid()}"):
        second.claim()
    CoverageStore(tmp_path, "other").claim()  # another sink is another lock
    first.release()
    killed = second.path.with_name(second.path.name + ".tmp-4610")  # a kill -9 mid-flush
    killed.write_text("{")
    second.claim()
    assert not killed.exists()  # the one feeder removes what a dead one left
    second.release()


def test_the_destination_record_replaces_the_store(tmp_path: Path) -> None:
    store = CoverageStore(tmp_path, "lake")
    store.add(("t", 0, 0), 0, 100)
    store.add(("t", 1, 0), 0, 50)
    store.flush()
    # The table holds less of partition 0 (restored from an old snapshot) and nothing of 1.
    store.replace({("t", 0, 0): [(0, 60)]})
    assert store.covered(("t", 0, 0)) == [(0, 60)] and store.covered(("t", 1, 0)) == []
    assert store.flush()
    assert CoverageStore(tmp_path, "lake").snapshot() == {("t", 0, 0): [(0, 60)]}
    store.replace({("t", 0, 0): [(0, 60)]})
    assert not store.flush()  # unchanged: nothing written


def test_removed_ranges_are_gaps_again_and_durably_so(tmp_path: Path) -> None:
    s = CoverageStore(tmp_path, "lake")
    s.add(K, 0, 100)
    s.remove(K, [(57, 58), (90, 95)])
    s.remove(("orders", 9, 0), [(0, 1)])  # a key it never covered: nothing
    assert s.covered(K) == [(0, 57), (58, 90), (95, 100)]
    assert s.gaps(K, [(0, 100)]) == [(57, 58), (90, 95)]
    assert s.flush()
    assert CoverageStore(tmp_path, "lake").covered(K) == [(0, 57), (58, 90), (95, 100)]
