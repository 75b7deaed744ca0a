"""Lane files: durable writes, naming, coverage, resume and crash repair."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thalweg.config.models import RawLaneConfig
from thalweg.errors import PrefixMismatchError
from thalweg.lane import Coverage, Lane, LaneLayout, SegmentWriter, resume_position, scan_coverage
from thalweg.lane.coverage import repair
from thalweg.records import MetadataColumns, build_raw_batch

COLS = MetadataColumns()
R = namedtuple("R", "topic partition offset timestamp timestamp_type key value headers")


def raw(offsets: list[int]) -> pa.Table:
    recs = [R("t", 0, o, 0, 0, None, b"{}", ()) for o in offsets]
    return pa.Table.from_batches([build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=COLS)])


def writer(tmp_path: Path) -> tuple[LaneLayout, SegmentWriter]:
    layout = LaneLayout(tmp_path)
    return layout, SegmentWriter(layout, COLS, RawLaneConfig())


def test_segment_names_layout_and_footer(tmp_path: Path) -> None:
    _layout, w = writer(tmp_path)
    out = w.write("t", 0, raw([5, 6, 7]), None, 5, 8)
    assert (
        out.segment.path
        == tmp_path / "raw/topic=t/partition=0/00000000000000000005-00000000000000000007.parquet"
    )
    meta = pq.read_schema(out.segment.path).metadata
    assert meta[b"thalweg.covers_from"] == b"5" and meta[b"thalweg.covers_to"] == b"8"
    assert not [p for p in out.segment.path.parent.iterdir() if ".tmp-" in p.name]
    assert pq.read_table(out.segment.path).num_rows == 3


def test_coverage_bridges_skipped_offsets(tmp_path: Path) -> None:
    layout, w = writer(tmp_path)
    w.write("t", 0, raw([0, 1, 2]), None, 0, 3)
    w.write("t", 0, raw([5, 6]), None, 3, 7)  # offsets 3-4 were transaction markers
    w.write("t", 0, raw([20]), None, 15, 21)  # a real gap: 7..14 missing
    cov = scan_coverage(layout, "t", 0)
    assert cov.ranges == [(0, 7), (15, 21)]


@pytest.mark.parametrize(
    ("ranges", "committed", "expected"),
    [
        ([], None, None),
        ([(0, 10)], None, 10),
        ([(0, 10)], 4, 10),  # crash between rename and commit: the lane wins
        ([(0, 10)], 10, 10),
        ([(0, 10)], 25, 25),  # lane lost: the committed offset wins
        ([(0, 10), (15, 20)], 3, 10),  # resume at the end of the run that holds it
    ],
)
def test_resume_position(
    ranges: list[tuple[int, int]], committed: int | None, expected: int | None
) -> None:
    cov = Coverage()
    for a, b in ranges:
        cov.add(a, b)
    assert resume_position(cov, committed) == expected


def test_repair_removes_temp_files_and_orphans(tmp_path: Path) -> None:
    layout, w = writer(tmp_path)
    w.write("t", 0, raw([0, 1]), raw([0, 1]), 0, 2)
    raw_dir = layout.partition_dir(Lane.RAW, "t", 0)
    dec_dir = layout.partition_dir(Lane.DECODED, "t", 0)
    (raw_dir / "00000000000000000002-00000000000000000003.parquet.tmp-99").write_bytes(b"x")
    orphan = dec_dir / "00000000000000000002-00000000000000000003.parquet"
    orphan.write_bytes(b"x")
    dlq_dir = layout.partition_dir(Lane.DLQ, "t", 0)
    dlq_dir.mkdir(parents=True)
    dlq_orphan = dlq_dir / orphan.name
    dlq_orphan.write_bytes(b"x")
    w.write("t", 0, raw([4]), None, 2, 5)  # decoded write skipped
    missing = repair(layout, "t", 0)
    assert not orphan.exists() and not dlq_orphan.exists()
    assert [p.name for p in raw_dir.iterdir() if ".tmp-" in p.name] == []
    assert [s.first for s in missing] == [4]


def test_prefix_change_is_refused(tmp_path: Path) -> None:
    LaneLayout(tmp_path).claim("_twg_")
    LaneLayout(tmp_path).claim("_twg_")
    with pytest.raises(PrefixMismatchError, match="refused"):
        LaneLayout(tmp_path).claim("_x_")


def test_segment_reads_push_projection_and_filter_into_the_scan(tmp_path: Path) -> None:
    import pyarrow.compute as pc

    from thalweg.lane.read.reader import LaneReader

    layout, w = writer(tmp_path)
    w.write("t", 0, raw(list(range(10))), None, 0, 10)
    reader = LaneReader(layout, COLS)
    wanted = {COLS.source("key"), COLS.timestamp}
    predicate = pc.field(COLS.offset) >= 7
    [(table, _)] = list(
        reader.read_pairs(
            "t", 0, 0, 10, decoded=False, with_raw=False, wanted=wanted, predicate=predicate
        )
    )
    # Only the wanted columns (plus the position, needed for ranges) were read...
    assert set(table.column_names) == wanted | {COLS.position}
    # ...and only the rows the predicate keeps.
    assert table.column(COLS.position).to_pylist() == [7, 8, 9]


def test_a_decoded_read_takes_from_the_raw_twin_only_what_the_decoded_file_lacks(
    tmp_path: Path,
) -> None:
    from thalweg.lane.read.reader import LaneReader

    layout, w = writer(tmp_path)
    r = raw([0, 1, 2])
    # A decoded file without the partition column (as an older lane's could be): the read
    # takes it from the raw twin, and the key, which only the raw file holds.
    decoded = pa.table(
        {
            "x": [1, 2, 3],
            COLS.offset: r.column(COLS.offset),
            COLS.position: r.column(COLS.position),
            COLS.decode_error: [None] * 3,
        }
    )
    w.write("t", 0, r, decoded, 0, 3)
    dpath = layout.partition_dir(Lane.DECODED, "t", 0)
    [path] = list(dpath.glob("*.parquet"))
    stored = pq.read_table(path)
    if COLS.partition in stored.column_names:
        pq.write_table(stored.drop_columns([COLS.partition]), path)
    reader = LaneReader(layout, COLS)
    wanted = {"x", COLS.source("key"), COLS.partition, COLS.position}
    [(twin, dec)] = list(
        reader.read_pairs("t", 0, 0, 3, decoded=True, with_raw=True, wanted=wanted)
    )
    assert twin is not None and dec is not None
    # The raw twin gave only what the decoded file lacks: no second position column.
    assert set(twin.column_names) == {COLS.source("key"), COLS.partition}
    assert twin.column(COLS.partition).to_pylist() == [0, 0, 0]
    assert dec.column(COLS.position).to_pylist() == [0, 1, 2]


def test_the_decoded_lane_can_use_its_own_codec(tmp_path: Path) -> None:
    layout = LaneLayout(tmp_path)
    w = SegmentWriter(layout, COLS, RawLaneConfig(decoded_compression="lz4"))
    r = raw([0, 1, 2])
    decoded = pa.table(
        {"x": [1, 2, 3], COLS.offset: r.column(COLS.offset), COLS.decode_error: [None] * 3}
    )
    written = w.write("t", 0, r, decoded, 0, 3)
    name = written.segment.path.name

    def codec(path: Path) -> str:
        return str(pq.read_metadata(path).row_group(0).column(0).compression)

    assert codec(written.segment.path) == "ZSTD"
    assert codec(layout.partition_dir(Lane.DECODED, "t", 0) / name) == "LZ4"


def test_decoded_statistics_are_kept_where_they_prune(tmp_path: Path) -> None:
    """A decoded segment has min/max for its fields and the position, partition and
    timestamp columns, not for record ids, message ids, cluster or topic (one value per
    table, or opaque bytes: nothing to prune by, and a third of the write's cost)."""
    layout = LaneLayout(tmp_path)
    w = SegmentWriter(layout, COLS, RawLaneConfig())
    r = raw([0, 1, 2])
    keep = [COLS.source("cluster"), COLS.topic, COLS.partition, COLS.offset, COLS.record_id]
    keep += [COLS.source("message_id"), COLS.position]
    decoded = r.select(keep).append_column("x", pa.array([3, 1, 2]))
    decoded = decoded.append_column(COLS.decode_error, pa.nulls(3, pa.string()))
    written = w.write("t", 0, r, decoded, 0, 3)
    meta = pq.read_metadata(layout.partition_dir(Lane.DECODED, "t", 0) / written.segment.path.name)
    group = meta.row_group(0)
    has = {
        group.column(i).path_in_schema: group.column(i).is_stats_set
        for i in range(group.num_columns)
    }
    assert {k for k, v in has.items() if not v} == {
        COLS.source("cluster"),
        COLS.topic,
        COLS.record_id,
        COLS.source("message_id"),
    }
    assert group.column(list(has).index("x")).statistics.min == 1


class _Crash(BaseException):
    """The process dying: not an error anything in the writer may catch."""


def test_dead_letters_are_durable_before_the_raw_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/lanes.md: dead letters, then decoded, then raw. A crash right after the raw
    segment's rename must find the dead letters already on disk: the raw segment moves the
    resume position past these records, so they are never fetched (or dead-lettered)
    again."""
    import thalweg.lane.durable as durable_module

    layout = LaneLayout(tmp_path)
    w = SegmentWriter(layout, COLS, RawLaneConfig(fsync=True))
    real_fsync_dir = durable_module.fsync_dir

    def dying_fsync_dir(path: Path) -> None:
        real_fsync_dir(path)
        raw_dir = layout.partition_dir(Lane.RAW, "t", 0)
        if path == raw_dir and any(p.suffix == ".parquet" for p in raw_dir.iterdir()):
            raise _Crash  # killed right after the raw segment became durable

    monkeypatch.setattr(durable_module, "fsync_dir", dying_fsync_dir)
    errors = COLS.decode_error
    decoded = pa.table({"a": [1, None, 3, None], errors: [None, "syntax: bad", None, "empty: x"]})
    with pytest.raises(_Crash):
        w.write("t", 0, raw([0, 1, 2, 3]), decoded, 0, 4)

    # The restart: repair keeps the raw segment and resumes after it...
    repair(layout, "t", 0)
    assert scan_coverage(layout, "t", 0).end == 4
    assert resume_position(scan_coverage(layout, "t", 0), None) == 4
    # ...so the two dead letters must already be in the dead-letter lane.
    dlq = layout.segments(Lane.DLQ, "t", 0)
    assert [s.path.name for s in dlq] == ["00000000000000000000-00000000000000000003.parquet"], (
        "the raw segment is durable but its dead letters are not: they are lost"
    )
    dead = pq.read_table(dlq[0].path)
    assert dead.column(COLS.position).to_pylist() == [1, 3]
    assert dead.column(COLS.stamped("dlq_reason")).to_pylist() == ["syntax", "empty"]


def test_the_decoded_schema_follows_a_segment_written_again_under_its_name(
    tmp_path: Path,
) -> None:
    """The reader remembers the decoded lane's schema per newest segment; a new epoch
    writes the same segment names again, with a schema of its own."""
    from thalweg.lane.read.reader import LaneReader

    layout, w = writer(tmp_path)
    reader = LaneReader(layout, COLS)

    def write(field: str) -> None:
        r = raw([0, 1, 2])
        decoded = pa.table(
            {field: [1, 2, 3], COLS.offset: r.column(COLS.offset), COLS.decode_error: [None] * 3}
        )
        w.write("t", 0, r, decoded, 0, 3)

    write("x")
    first = reader.decoded_schema("t")
    assert first is not None and "x" in first.names
    assert reader.decoded_schema("t") is first  # remembered
    for lane in (Lane.RAW, Lane.DECODED):  # the epoch's files moved away...
        for f in layout.partition_dir(lane, "t", 0).glob("*.parquet"):
            f.unlink()
    write("another_field")  # ...and the same name written again
    again = reader.decoded_schema("t")
    assert again is not None and "another_field" in again.names and "x" not in again.names


def test_repair_removes_interrupted_writes_beside_the_lanes_too(tmp_path: Path) -> None:
    """A kill -9 inside any durable write of a partition's state leaves ``<name>.tmp-<pid>``
    (a CI run found one beside a retention floor): start-up removes each, and only those."""
    from thalweg.lane.read.elsewhere import elsewhere_path

    layout, w = writer(tmp_path)
    w.write("t", 0, raw([0, 1]), raw([0, 1]), 0, 2)
    floor = layout.floor_path("t", 0)
    marker = elsewhere_path(layout, "t", 0)
    dead = layout.node_dead_letter_dir("enrich", "t", 0)
    other = layout.floor_path("t", 1)  # another partition's: its owner's to clean
    for directory in (floor.parent, marker.parent, dead):
        directory.mkdir(parents=True, exist_ok=True)
    floor.write_text('{"floor": 0, "steps": []}\n')
    left = [
        floor.with_name(floor.name + ".tmp-4610"),
        marker.with_name(marker.name + ".tmp-77"),
        dead / "00000000000000000000-00000000000000000001.parquet.tmp-5",
    ]
    for path in [*left, other.with_name(other.name + ".tmp-9")]:
        path.write_bytes(b"half")
    repair(layout, "t", 0)
    assert not any(p.exists() for p in left)
    assert floor.exists() and other.with_name(other.name + ".tmp-9").exists()


def test_a_segment_parquet_cannot_hold_is_not_retried(tmp_path: Path) -> None:
    """Parquet has no mapping for an interval: the same table fails every time, so the
    error says not to retry (a retriable one held a batch run for ever) and nothing of
    the segment is left behind."""
    import numpy as np

    from thalweg.errors import UnwritableSegmentError
    from thalweg.records.file_rows import file_rows_batch

    _, w = writer(tmp_path)
    iv = pa.array([pa.MonthDayNano([1, 2, 3])] * 2, pa.month_day_nano_interval())
    batch = file_rows_batch(
        table=pa.table({"iv": iv}),
        rows=np.arange(2, dtype=np.int64),
        broken=[],
        topic="t",
        partition=0,
        uri="file:///x.arrow",
        mtime_ms=0,
        cluster="c",
        ingest_ts_us=0,
        columns=COLS,
    )
    decoded = pa.table(
        {"iv": iv, COLS.offset: batch.column(COLS.offset), COLS.decode_error: [None] * 2}
    )
    with pytest.raises(UnwritableSegmentError, match="month_day_nano_interval") as info:
        w.write("t", 0, pa.Table.from_batches([batch]), decoded, 0, 2)
    assert info.value.retriable is False
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".json"]


def test_two_writes_of_one_file_in_one_process_do_not_share_a_temp_file(tmp_path: Path) -> None:
    """Two sinks under one pipeline node both write the node's dead-letter file: with a
    temp name of the pid alone, the second write took the first's temp file and renamed
    it away, and the first failed at its rename (ENOENT; seen as a sink degraded for a
    minute in test_dag_crash)."""
    from thalweg.lane.durable import write_file_durably

    path = tmp_path / "f.parquet"

    def inner(tmp: Path) -> None:
        tmp.write_bytes(b"inner")

    def outer(tmp: Path) -> None:
        tmp.write_bytes(b"outer")
        write_file_durably(path, inner)  # the other writer, meanwhile

    write_file_durably(path, outer)
    assert path.read_bytes() == b"outer"
    assert [p.name for p in tmp_path.iterdir()] == ["f.parquet"]
