"""The segment cache: bounded LRU, write-through tables identical to the files, and reads
that give the same rows and columns whether the segment is cached or not."""

from __future__ import annotations

import json
from collections import namedtuple
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from thalweg.codecs.json import JsonArrowDecoder
from thalweg.config.models import RawLaneConfig
from thalweg.lane import Lane, LaneLayout, SegmentWriter
from thalweg.lane.read.cache import SegmentCache
from thalweg.lane.read.reader import LaneReader
from thalweg.pipeline.decode import decode_batch
from thalweg.records import MetadataColumns, build_raw_batch

COLS = MetadataColumns()
R = namedtuple("R", "topic partition offset timestamp timestamp_type key value headers")


def table_of(nbytes: int) -> pa.Table:
    return pa.table({"b": pa.array([b"x" * nbytes], pa.binary())})


def test_lru_by_bytes_and_oversize_tables_are_not_kept() -> None:
    one = table_of(1000).get_total_buffer_size()
    cache = SegmentCache(max_bytes=one * 4 + 10)
    for i in range(4):
        cache.put(Path(f"s{i}"), table_of(1000))
    assert cache.nbytes == 4 * one
    assert cache.get(Path("s0")) is not None  # s0 is now the most recently used
    cache.put(Path("s4"), table_of(1000))
    assert cache.get(Path("s1")) is None  # the least recently used went first
    assert cache.get(Path("s0")) is not None
    assert cache.nbytes <= cache.max_bytes
    cache.put(Path("big"), table_of(one * 2))  # over a quarter of the bound
    assert cache.get(Path("big")) is None
    cache.discard(Path("s0"))
    assert cache.get(Path("s0")) is None
    assert (cache.hits, cache.misses) == (2, 3)
    off = SegmentCache(0)
    off.put(Path("s"), table_of(10))
    assert off.get(Path("s")) is None and off.nbytes == 0


def segment(offsets: list[int]) -> tuple[pa.Table, pa.Table]:
    values = [
        json.dumps(
            {
                "i": o,
                "name": f"n{o}",
                "tags": ["a", "b"][: o % 3],
                "inner": {"x": o * 1.5, "when": "2026-11-30T10:00:00"},
            }
        ).encode()
        for o in offsets
    ]
    recs = [
        R("t", 0, o, 1_700_000_000_000 + o, 0, b"k", v, (("h", b"v"),))
        for o, v in zip(offsets, values, strict=True)
    ]
    batch = build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=COLS)
    decoded, _ = decode_batch(JsonArrowDecoder(COLS), batch, COLS)
    return pa.Table.from_batches([batch]), decoded


def test_write_through_tables_are_what_the_files_hold(tmp_path: Path) -> None:
    layout = LaneLayout(tmp_path)
    cache = SegmentCache(64 << 20)
    raw, dec = segment(list(range(100)))
    written = SegmentWriter(layout, COLS, RawLaneConfig(), cache).write("t", 0, raw, dec, 0, 100)
    dpath = layout.partition_dir(Lane.DECODED, "t", 0) / written.segment.path.name
    for path in (written.segment.path, dpath):
        cached = cache.get(path)
        assert cached is not None
        on_disk = pq.read_table(path).replace_schema_metadata(None)
        assert cached.schema == on_disk.schema
        assert cached.equals(on_disk)


def test_cached_and_uncached_reads_agree(tmp_path: Path) -> None:
    layout = LaneLayout(tmp_path)
    cache = SegmentCache(64 << 20)
    writer = SegmentWriter(layout, COLS, RawLaneConfig(), cache)
    for first in (0, 50):
        raw, dec = segment(list(range(first, first + 50)))
        writer.write("t", 0, raw, dec, first, first + 50)
    cold = LaneReader(layout, COLS)
    hot = LaneReader(layout, COLS, cache)
    cases = [
        {"wanted": None, "predicate": None},
        {"wanted": {"i", "name"}, "predicate": None},
        {"wanted": None, "predicate": pc.field("i") > 60},
        {"wanted": {"name"}, "predicate": pc.field(COLS.offset) >= 42},
    ]
    for case in cases:
        for decoded, with_raw in ((True, False), (False, False), (True, True)):
            args = ("t", 0, 10, 90)
            kw = {"decoded": decoded, "with_raw": with_raw, **case}
            if with_raw and decoded:
                kw["predicate"] = None  # twins stay row-aligned: never pushed
            if not decoded and case["wanted"] != {"name"} and case["predicate"] is not None:
                continue  # a payload filter is never pushed into the raw lane
            if not decoded and case["wanted"] is not None:
                kw["wanted"] = {COLS.source("key")}
            before = cache.hits
            got = list(hot.read_pairs(*args, **kw))  # type: ignore[arg-type]
            want = list(cold.read_pairs(*args, **kw))  # type: ignore[arg-type]
            assert cache.hits > before, "the cached reader did not use the cache"
            assert len(got) == len(want) >= 1
            for (gr, gd), (wr, wd) in zip(got, want, strict=True):
                for g, w in ((gr, wr), (gd, wd)):
                    assert (g is None) == (w is None)
                    if g is not None:
                        assert g.column_names == w.column_names
                        assert g.equals(w), case


def test_a_full_read_fills_the_cache(tmp_path: Path) -> None:
    layout = LaneLayout(tmp_path)
    raw, dec = segment(list(range(20)))
    SegmentWriter(layout, COLS, RawLaneConfig()).write("t", 0, raw, dec, 0, 20)
    cache = SegmentCache(64 << 20)
    reader = LaneReader(layout, COLS, cache)
    list(reader.read_pairs("t", 0, 0, 20, decoded=True, with_raw=False, wanted={"i"}))
    assert cache.nbytes == 0  # a narrow read is not the segment: not kept
    list(reader.read_pairs("t", 0, 0, 20, decoded=True, with_raw=False))
    assert cache.nbytes > 0
    [(_, table)] = list(reader.read_pairs("t", 0, 5, 8, decoded=True, with_raw=False))
    assert table is not None and table.column("i").to_pylist() == [5, 6, 7]
    assert cache.hits == 1
