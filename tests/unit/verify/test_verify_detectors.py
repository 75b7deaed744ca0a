"""Every detector of ``twg verify`` planted and seen to fire, on lanes written here (no
broker) and an Arrow IPC sink: a raw file inside another (``contained``), a decoded twin
not holding its raw file's positions (``twin_mismatch``), a dead-letter file not holding
the twin's failed records (``dead_letters``), a decoded twin lost (``twin_missing``, an
error), the lane's first segments lost under its origin record or its retention floor
(``start_missing``), an interrupted write judged by whether a writer holds the lane
(``temp_file``), a partition the broker holds and the lane never did
(``partition_missing`` / ``partition_not_yet``), a destination row twice
(``sink_duplicate``) or where the lane gives none (``sink_extra``), a record in a sink's
dead-letter lane twice (``refused_twice``) — and a report whose broker check could not
run failing ``assert_verified``. Each case first verifies clean, so it is the planted
fault that is named."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import thalweg.verify.run as verify_run
from tests.helpers import assert_verified, write_segment
from tests.unit.verify.test_verify_live import codes, configured, recover, verify
from thalweg.config import load_config
from thalweg.kafka.offsets import PartitionOffsets
from thalweg.lane import LaneLayout
from thalweg.lane.layout import Lane, segment_name
from thalweg.lane.liveness import hold_running
from thalweg.lane.origin import read_origin
from thalweg.lane.upkeep.retention import raise_floor
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.refused import SinkDeadLetters
from thalweg.verify.lanes import LaneAudit
from thalweg.verify.report import Report


def findings(report: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(f["code"], f["where"], f["level"]) for f in report["findings"]}


def lane_of(tmp_path: Path, *ranges: tuple[int, int]) -> tuple[Path, Path, LaneLayout]:
    """Partition 0 of topic ``t``: one segment per ``[first, end)``, verified clean."""
    lane, config = configured(tmp_path)
    for first, end in ranges:
        write_segment(lane, "t", 0, range(first, end), first)
    code, report = verify(config)
    assert code == 0 and codes(report) == [], report["findings"]
    return lane, config, LaneLayout(lane)


def raw(layout: LaneLayout, first: int, last: int) -> Path:
    return layout.partition_dir(Lane.RAW, "t", 0) / segment_name(first, last)


def test_a_raw_file_inside_another_that_is_no_merge_is_two_writers(tmp_path: Path) -> None:
    _, config, layout = lane_of(tmp_path, (0, 10))
    shutil.copy(raw(layout, 0, 9), raw(layout, 2, 3))
    code, report = verify(config)
    assert code == 1 and ("contained", "t[0]", "error") in findings(report), report


def test_a_twin_not_holding_its_raw_files_positions_is_named(tmp_path: Path) -> None:
    _, config, layout = lane_of(tmp_path, (0, 5))
    twin = layout.partition_dir(Lane.DECODED, "t", 0) / raw(layout, 0, 4).name
    pq.write_table(pq.read_table(twin).slice(0, 3), twin)
    code, report = verify(config)
    assert code == 1 and ("twin_mismatch", "t[0]", "error") in findings(report), report


def test_dead_letters_not_the_twins_failures_are_named(tmp_path: Path) -> None:
    _, config, layout = lane_of(tmp_path, (0, 5))
    dlq = layout.partition_dir(Lane.DLQ, "t", 0)
    dlq.mkdir(parents=True)
    shutil.copy(raw(layout, 0, 4), dlq / raw(layout, 0, 4).name)  # 5 letters, 0 failures
    code, report = verify(config)
    assert code == 1 and ("dead_letters", "t[0]", "error") in findings(report), report


def test_a_lost_twin_is_an_error_naming_the_fix(tmp_path: Path) -> None:
    _, config, layout = lane_of(tmp_path, (0, 5), (5, 10))
    (layout.partition_dir(Lane.DECODED, "t", 0) / raw(layout, 5, 9).name).unlink()
    code, report = verify(config)
    assert code == 1 and ("twin_missing", "t[0]", "error") in findings(report), report
    [message] = [f["message"] for f in report["findings"] if f["code"] == "twin_missing"]
    assert "positions 5-9" in message and "twg stream" in message


def test_the_first_segment_lost_is_named_against_the_origin_record(tmp_path: Path) -> None:
    _, config, layout = lane_of(tmp_path, (3, 8), (8, 12))
    assert read_origin(layout, "t", 0) == 3  # written before the first segment
    for lane in (Lane.RAW, Lane.DECODED):
        (layout.partition_dir(lane, "t", 0) / raw(layout, 3, 7).name).unlink()
    code, report = verify(config)
    assert code == 1 and ("start_missing", "t[0]", "error") in findings(report), report
    [message] = [f["message"] for f in report["findings"] if f["code"] == "start_missing"]
    assert message.startswith("positions 3-7 are in no raw segment")
    assert "origin record says 3" in message


def test_a_later_segment_never_moves_the_origin(tmp_path: Path) -> None:
    lane, _, layout = lane_of(tmp_path, (3, 8))
    write_segment(lane, "t", 0, range(8, 12), 8)  # a new writer: the lane is not empty
    assert read_origin(layout, "t", 0) == 3


def test_the_first_segment_above_the_retention_floor_lost_is_named(tmp_path: Path) -> None:
    _, config, layout = lane_of(tmp_path, (0, 5), (5, 10), (10, 15))
    raise_floor(layout, "t", 0, 5, time.time() - 600)
    for lane in (Lane.RAW, Lane.DECODED):
        for first, last in ((0, 4), (5, 9)):
            (layout.partition_dir(lane, "t", 0) / raw(layout, first, last).name).unlink()
    code, report = verify(config)
    assert code == 1 and ("start_missing", "t[0]", "error") in findings(report), report
    [message] = [f["message"] for f in report["findings"] if f["code"] == "start_missing"]
    assert "positions 5-9" in message and "retention floor is 5" in message


def test_an_old_temp_file_is_an_error_only_once_no_writer_holds_the_lane(tmp_path: Path) -> None:
    lane, config, layout = lane_of(tmp_path, (0, 5))
    stale = raw(layout, 5, 9).with_name(raw(layout, 5, 9).name + ".tmp-1-0")
    stale.write_bytes(b"")
    os.utime(stale, (time.time() - 120, time.time() - 120))
    code, report = verify(config)
    assert code == 1 and ("temp_file", "t[0]", "error") in findings(report), report
    assert report["stopped"] is True
    held = hold_running(lane)  # a gateway writing the lane now
    try:
        code, report = verify(config)
    finally:
        os.close(held)
    assert code == 0 and ("temp_file", "t[0]", "warning") in findings(report), report
    assert report["stopped"] is False


def test_a_partition_the_broker_holds_and_the_lane_never_did_is_named() -> None:
    never = {("t", 1): PartitionOffsets(0, 7, None)}
    empty_log = {("t", 2): PartitionOffsets(4, 4, None)}
    held = {("t", 0): LaneAudit("t", 0, 0, 0, [(0, 3)], 3, np.arange(3), np.arange(3), False)}
    for stopped, code, level in ((True, "partition_missing", "error"),
                                 (False, "partition_not_yet", "warning")):  # fmt: skip
        report = Report()
        verify_run._check_unheld(
            ["t"], {**never, **empty_log}, held, report, stopped, frozenset({"t"})
        )
        assert [(f.code, f.where, f.level) for f in report.findings] == [(code, "t[1]", level)]
        assert "offsets 0-6" in report.findings[0].message
    # No partition of the topic ingested and nothing committed (a gateway that never ran,
    # a first drain abandoned): owed, not lost — a warning even on a stopped lane.
    report = Report()
    verify_run._check_unheld(["t"], never, {}, report, True, frozenset({"t"}))
    assert [(f.code, f.level) for f in report.findings] == [("partition_not_yet", "warning")]
    assert "no partition of 't' has a lane yet" in report.findings[0].message
    # A source reading from the latest was never due them; a lane that began after them
    # (its origin record) holds them on purpose.
    report = Report()
    verify_run._check_unheld(["t"], never, held, report, True, frozenset())
    assert report.findings == []
    lane = LaneAudit("t", 1, 0, 0, [], 0, np.zeros(0), np.zeros(0), False, origin=7)
    verify_run._check_unheld(["t"], never, {**held, ("t", 1): lane}, report, True, frozenset({"t"}))
    assert report.findings == []


def _rewrite(path: Path, change: Any) -> None:
    table = change(pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all())
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def sink_files(lane: Path) -> list[Path]:
    return sorted((lane / "sinks" / "files" / "topic=t" / "partition=0").glob("*.arrow"))


def test_a_destination_row_twice_is_named(tmp_path: Path) -> None:
    lane, config, _ = lane_of(tmp_path, (0, 5))
    recover(config)
    code, report = verify(config)
    assert code == 0 and codes(report) == [], report["findings"]
    _rewrite(sink_files(lane)[0], lambda t: pa.concat_tables([t, t.slice(0, 1)]))
    code, report = verify(config)
    assert code == 1 and ("sink_duplicate", "sink files: t[0]", "error") in findings(report)


def test_a_destination_row_where_the_lane_gives_none_is_named(tmp_path: Path) -> None:
    # 0-4, a skipped offset at 5 (the next segment covers from it), 6-9: the sink covers
    # 5 and the lane gives it no row there.
    lane, config = configured(tmp_path)
    write_segment(lane, "t", 0, range(5), 0)
    write_segment(lane, "t", 0, range(6, 10), 5)
    recover(config)
    code, report = verify(config)
    assert code == 0 and codes(report) == [], report["findings"]
    position = MetadataColumns().position

    def at_five(t: pa.Table) -> pa.Table:
        row = t.slice(0, 1)
        i = row.schema.get_field_index(position)
        row = row.set_column(i, position, pa.array([5], row.schema.field(i).type))
        return pa.concat_tables([t, row])

    _rewrite(sink_files(lane)[-1], at_five)
    code, report = verify(config)
    assert code == 1 and ("sink_extra", "sink files: t[0]", "error") in findings(report), report


def test_a_record_set_aside_twice_is_named(tmp_path: Path) -> None:
    # The destination refused positions 1 and 2: set aside, not in its file.
    lane, config, layout = lane_of(tmp_path, (0, 5))
    recover(config)
    position = MetadataColumns().position
    _rewrite(
        sink_files(lane)[0], lambda t: t.filter(pc.invert(pc.is_in(t[position], pa.array([1, 2]))))
    )
    refused = SinkDeadLetters(layout, "files", MetadataColumns())
    assert refused.record("t", 0, np.array([1, 2]), ["too long", "too long"]) == 2
    code, report = verify(config)
    assert code == 0 and codes(report) == [], report["findings"]
    directory = layout.refused_dir("files", "t", 0)
    shutil.copy(directory / segment_name(1, 2), directory / segment_name(1, 3))
    code, report = verify(config)
    assert code == 1 and ("refused_twice", "sink files: t[0]", "error") in findings(report)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_report_whose_broker_check_did_not_run_fails_assert_verified(tmp_path: Path) -> None:
    _, config, _ = lane_of(tmp_path, (0, 5))
    cfg = load_config(config)  # its cluster, 127.0.0.1:9, answers nobody
    report = verify_run.verify(cfg)
    assert report.ok and [f.code for f in report.unchecked] == ["broker_unreachable"]
    with pytest.raises(AssertionError, match="a check did not run"):
        assert_verified(cfg)
    assert_verified(cfg, broker=False)  # leaving the cluster out, said


def _age(path: Path, seconds: float = 120) -> None:
    os.utime(path, (time.time() - seconds, time.time() - seconds))


def _rows(path: Path, pick: list[int]) -> None:
    """``path`` rewritten to hold its rows ``pick`` (in that order), footer kept."""
    table = pq.read_table(path)
    pq.write_table(table.take(pa.array(pick)), path)


def test_a_raw_file_holding_other_positions_than_its_name_says_is_named(tmp_path: Path) -> None:
    _, config, layout = lane_of(tmp_path, (0, 5))
    _rows(raw(layout, 0, 4), [1, 2, 3, 4])
    code, report = verify(config)
    assert code == 1 and ("misnamed", "t[0]", "error") in findings(report), report


def test_a_position_twice_in_one_raw_file_is_named(tmp_path: Path) -> None:
    _, config, layout = lane_of(tmp_path, (0, 5))
    _rows(raw(layout, 0, 4), [0, 1, 1, 2, 3, 4])
    code, report = verify(config)
    assert code == 1 and ("duplicate", "t[0]", "error") in findings(report), report
    assert any("holds a position twice" in f["message"] for f in report["findings"])


def test_a_position_in_two_raw_files_is_named(tmp_path: Path) -> None:
    _, config, layout = lane_of(tmp_path, (0, 5), (5, 10))
    # Segment 5-9 rewritten as 4-9: named 5-9 it would be misnamed; named 4-9 the listing
    # overlaps. Both files hold position 4.
    table = pq.read_table(raw(layout, 0, 4))
    later = pq.read_table(raw(layout, 5, 9))
    pq.write_table(pa.concat_tables([table.slice(4, 1), later]), raw(layout, 4, 9))
    raw(layout, 5, 9).unlink()
    code, report = verify(config)
    found = findings(report)
    assert code == 1 and ("duplicate", "t[0]", "error") in found, report
    assert any("positions are held twice" in f["message"] for f in report["findings"])


def test_a_segment_below_the_floor_still_on_disk_a_minute_on_is_a_warning(tmp_path: Path) -> None:
    _, config, layout = lane_of(tmp_path, (0, 5), (5, 10))
    raise_floor(layout, "t", 0, 5, time.time() - 600)
    _age(raw(layout, 0, 4))
    code, report = verify(config)
    assert code == 0 and ("below_floor", "t[0]", "warning") in findings(report), report


def test_a_merges_part_still_on_disk_a_minute_on_is_a_warning(tmp_path: Path) -> None:
    from thalweg.lane.coverage import META_COMPACTED

    _, config, layout = lane_of(tmp_path, (0, 10))
    merged = raw(layout, 0, 9)
    table = pq.read_table(merged)
    part = raw(layout, 2, 3)
    pq.write_table(table.slice(2, 2), part)
    meta = {**(table.schema.metadata or {}), META_COMPACTED: b"1"}
    pq.write_table(table.replace_schema_metadata(meta), merged)
    _age(part)
    code, report = verify(config)
    assert code == 0 and ("unswept_part", "t[0]", "warning") in findings(report), report
    assert ("contained", "t[0]", "error") not in findings(report)


def test_an_unreadable_coverage_store_is_named_and_nothing_of_it_trusted(tmp_path: Path) -> None:
    lane, config, _ = lane_of(tmp_path, (0, 5))
    recover(config)
    (lane / "coverage" / "files.json").write_text("{not json")
    code, report = verify(config)
    assert code == 1 and ("store_unreadable", "sink files", "error") in findings(report), report


def test_a_destination_that_cannot_be_read_back_is_named(tmp_path: Path) -> None:
    lane, config, _ = lane_of(tmp_path, (0, 5))
    recover(config)
    sink_files(lane)[0].write_bytes(b"ARROW1 not a file")
    code, report = verify(config)
    found = findings(report)
    assert code == 1 and ("destination_unreadable", "sink files", "error") in found, report
    [message] = [f["message"] for f in report["findings"] if f["code"] == "destination_unreadable"]
    assert sink_files(lane)[0].name in message


def test_deep_names_a_topic_it_cannot_read_back_as_unchecked(tmp_path: Path) -> None:
    lane = tmp_path / "lane"
    write_segment(lane, "t", 0, range(5), 0)
    config = tmp_path / "pulsar.toml"
    config.write_text(
        f'[gateway]\ndata_dir = "{lane}"\n\n[[sources]]\nname = "p"\nkind = "pulsar"\n'
        'service_url = "pulsar://127.0.0.1:9"\ntopics = ["t"]\nsubscription = "s"\n'
    )
    report = verify_run.verify(load_config(config), deep=True)
    assert report.ok and [(f.code, f.where) for f in report.unchecked] == [
        ("deep_unchecked", "t")
    ], report.as_text()
    with pytest.raises(Exception, match="drop --no-broker"):
        verify_run.verify(load_config(config), deep=True, broker=False)


def test_a_sink_fed_across_a_closed_epoch_is_checked_by_coverage_there(tmp_path: Path) -> None:
    """The broker lost its log: epoch 0 closed at 0-4, epoch 1 starts at 0 again and the
    sink holds rows of both at the same positions. Its rows cannot be told apart by
    position: a warning says coverage is what is checked, and coverage still is — a
    claim beyond epoch 1's lane is an error."""
    from thalweg.lane.epochs import Divergence, close_epoch, mark_diverged
    from thalweg.recovery.coverage import CoverageStore

    lane, config, layout = lane_of(tmp_path, (0, 5))
    recover(config)
    mark_diverged(layout, Divergence("t", 0, 0, "log_end_below_lane", 5, 0, 0, "planted"))
    assert close_epoch(layout, "t", 0) == 1
    write_segment(lane, "t", 0, range(3), 0)
    recover(config)
    code, report = verify(config)
    assert code == 0 and findings(report) == {("epoch_rows", "sink files: t[0]", "warning")}
    assert [(p["epoch"], p["rows"]) for p in report["partitions"]] == [(1, 3)]
    store = CoverageStore(lane, "files")
    assert store.snapshot()[("t", 0, 1)] == [(0, 3)]
    # The destination's own record of epoch 1 (its file's name) claims 0-4.
    [newer] = [f for f in sink_files(lane) if f.name.startswith("e000001-")]
    newer.rename(newer.with_name(f"e000001-{0:020d}-{5:020d}.arrow"))
    code, report = verify(config)
    assert code == 1 and ("sink_ahead", "sink files: t[0]", "error") in findings(report), report
