"""Arrow IPC copies of decoded segments: written with the segment, mapped by cold reads."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.unit.lane.test_segment_cache import COLS, segment
from thalweg.config.models import RawLaneConfig
from thalweg.lane import Lane, LaneLayout, SegmentWriter
from thalweg.lane.read.cache import SegmentCache
from thalweg.lane.read.ipc_copies import IPC_DIR, IpcCopies
from thalweg.lane.read.reader import LaneReader


def _write(root: Path, copies: IpcCopies, starts: list[int]) -> list[Path]:
    """Write 50-record segments; the decoded paths."""
    layout = LaneLayout(root)
    writer = SegmentWriter(layout, COLS, RawLaneConfig(fsync=False), SegmentCache(0, copies))
    out = []
    for first in starts:
        raw, dec = segment(list(range(first, first + 50)))
        w = writer.write("t", 0, raw, dec, first, first + 50)
        out.append(layout.partition_dir(Lane.DECODED, "t", 0) / w.segment.path.name)
    return out


def test_copies_hold_the_decoded_file_and_are_mapped_not_copied(tmp_path: Path) -> None:
    copies = IpcCopies(tmp_path, 64 << 20)
    (dpath,) = _write(tmp_path, copies, [0])
    raw_path = LaneLayout(tmp_path).partition_dir(Lane.RAW, "t", 0) / dpath.name
    assert copies.copy_path(dpath) is not None and copies.copy_path(dpath).exists()
    assert copies.get(raw_path) is None, "raw segments are not copied"
    before = pa.total_allocated_bytes()
    mapped = copies.get(dpath)
    assert mapped is not None
    assert pa.total_allocated_bytes() == before, "read from the map, not into memory"
    on_disk = pq.read_table(dpath).replace_schema_metadata(None)
    assert mapped.schema == on_disk.schema and mapped.equals(on_disk)
    assert copies.hits == 1 and copies.nbytes == copies.copy_path(dpath).stat().st_size


def test_cold_reads_from_copies_equal_parquet_reads(tmp_path: Path) -> None:
    copies = IpcCopies(tmp_path, 64 << 20)
    _write(tmp_path, copies, [0, 50])
    layout = LaneLayout(tmp_path)
    mapped = LaneReader(layout, COLS, SegmentCache(0, copies))
    parquet = LaneReader(layout, COLS)
    for kw in (
        {"decoded": True, "with_raw": False},
        {"decoded": True, "with_raw": False, "wanted": {"name"}},
        {"decoded": True, "with_raw": False, "predicate": pc.field("i") > 60},
        {"decoded": True, "with_raw": True},
    ):
        got = list(mapped.read_pairs("t", 0, 10, 90, **kw))  # type: ignore[arg-type]
        want = list(parquet.read_pairs("t", 0, 10, 90, **kw))  # type: ignore[arg-type]
        assert len(got) == len(want) >= 1
        for g, w in zip(got, want, strict=True):
            for a, b in zip(g, w, strict=True):
                assert (a is None) == (b is None)
                assert a is None or a.equals(b), kw
    assert copies.hits >= 8


def test_the_budget_evicts_the_oldest_copies(tmp_path: Path) -> None:
    probe = IpcCopies(tmp_path / "probe", 64 << 20)
    (one,) = _write(tmp_path / "probe", probe, [0])
    size = probe.nbytes
    copies = IpcCopies(tmp_path, size * 4 + size // 2)
    paths = _write(tmp_path, copies, [0, 50, 100, 150, 200])
    assert copies.nbytes <= copies.max_bytes
    assert copies.get(paths[0]) is None, "the oldest went first"
    assert all(copies.get(p) is not None for p in paths[1:])
    # A fresh instance (a restart) counts what is on disk, oldest first.
    again = IpcCopies(tmp_path, size * 4 + size // 2)
    assert again.nbytes == copies.nbytes
    _write(tmp_path, again, [250])
    assert again.get(paths[1]) is None and again.get(paths[2]) is not None
    del one


def test_torn_and_missing_copies_fall_back_to_the_segment(tmp_path: Path) -> None:
    copies = IpcCopies(tmp_path, 64 << 20)
    (dpath,) = _write(tmp_path, copies, [0])
    target = copies.copy_path(dpath)
    assert target is not None
    target.write_bytes(target.read_bytes()[:100])  # a copy cut short (no fsync, a crash)
    assert copies.get(dpath) is None
    assert not target.exists(), "an unreadable copy is removed"
    reader = LaneReader(LaneLayout(tmp_path), COLS, SegmentCache(0, copies))
    ((_, dec),) = list(reader.read_pairs("t", 0, 0, 50, decoded=True, with_raw=False))
    assert dec is not None and dec.num_rows == 50
    # Temp files a crash left are removed at start-up.
    leftover = target.with_name(target.name + ".tmp-123")
    leftover.write_bytes(b"x")
    IpcCopies(tmp_path, 64 << 20)
    assert not leftover.exists()


def test_off_writes_nothing_and_large_tables_are_not_copied(tmp_path: Path) -> None:
    off = IpcCopies(tmp_path, 0)
    (dpath,) = _write(tmp_path, off, [0])
    assert off.get(dpath) is None and not (tmp_path / IPC_DIR).exists()
    tiny = IpcCopies(tmp_path / "tiny", 1000)  # every segment is over a quarter of it
    (dpath,) = _write(tmp_path / "tiny", tiny, [0])
    assert tiny.get(dpath) is None and tiny.nbytes == 0
    assert not list((tmp_path / "tiny").glob(f"{IPC_DIR}/**/*.arrow"))


def test_copies_of_removed_segments_go_at_the_next_write_and_at_start(tmp_path: Path) -> None:
    """Retention and compaction remove segments; their copies do not wait for the
    budget to push them out."""
    copies = IpcCopies(tmp_path, 64 << 20)
    a, b = _write(tmp_path, copies, [0, 50])
    a.unlink()  # as retention does
    (c,) = _write(tmp_path, copies, [100])

    def size(segment: Path) -> int:
        copy = copies.copy_path(segment)
        assert copy is not None
        return copy.stat().st_size if copy.exists() else 0

    assert size(a) == 0 and size(b) > 0
    assert copies.nbytes == size(b) + size(c)
    b.unlink()  # while the gateway is down
    again = IpcCopies(tmp_path, 64 << 20)
    assert size(b) == 0
    assert again.nbytes == size(c)


def test_retention_and_compaction_delete_the_copies_of_what_they_delete(
    tmp_path: Path,
) -> None:
    """At once, not at the next write: on a full disk the next write may never come,
    and the copies (four times a zstd segment's size) hold the room it needs."""
    from thalweg.lane.coverage import remove_merged
    from thalweg.lane.upkeep.retention import raise_floor, sweep

    copies = IpcCopies(tmp_path, 64 << 20)
    a, b, c = _write(tmp_path, copies, [0, 50, 100])
    layout = LaneLayout(tmp_path)
    raise_floor(layout, "t", 0, 50, now=0.0)
    sweep(layout, "t", 0, grace_s=0, now=1.0)
    kept = [s for s in (a, b, c) if (p := copies.copy_path(s)) is not None and p.exists()]
    assert kept == [b, c]
    (seg_b,) = [s for s in layout.segments(Lane.RAW, "t", 0) if s.path.name == b.name]
    remove_merged(layout, "t", 0, [seg_b])
    kept = [s for s in (b, c) if (p := copies.copy_path(s)) is not None and p.exists()]
    assert kept == [c]


def test_a_write_refused_for_want_of_space_drops_the_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache never holds space the lanes need: ENOSPC on a segment clears the copies,
    so the retry has their room; reads decode the Parquet segments meanwhile."""
    import errno
    import os

    from thalweg.errors import LaneError

    copies = IpcCopies(tmp_path, 64 << 20)
    (a,) = _write(tmp_path, copies, [0])
    assert copies.nbytes > 0
    layout = LaneLayout(tmp_path)
    writer = SegmentWriter(layout, COLS, RawLaneConfig(fsync=False), SegmentCache(0, copies))
    write_table = pq.write_table

    def full(table: pa.Table, where: object, *args: object, **kwargs: object) -> None:
        if "/raw/" in str(where):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write_table(table, where, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pq, "write_table", full)
    raw, dec = segment(list(range(50, 100)))
    with pytest.raises(LaneError, match="No space left on device"):
        writer.write("t", 0, raw, dec, 50, 100)
    monkeypatch.undo()
    copy = copies.copy_path(a)
    assert copy is not None and not copy.exists()
    assert copies.nbytes == 0
    reader = LaneReader(layout, COLS, SegmentCache(0, copies))
    pairs = list(reader.read_pairs("t", 0, 0, 50, decoded=True, with_raw=False))
    assert sum(t.num_rows for pair in pairs for t in pair if t is not None) == 50
    assert copies.hits == 0
