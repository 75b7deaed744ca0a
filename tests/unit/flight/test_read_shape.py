"""A projected history read is shaped only to the columns it sends or filters by
(``ReadPlan.shape_schema``), and gives exactly the rows and values of the same read
shaped whole and projected afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.unit.lane.test_lane import COLS, raw, writer
from thalweg.flight.read.plan import plan_read
from thalweg.flight.read.stream import read_stream
from thalweg.flight.read.tickets import parse_ticket
from thalweg.lane.read.cache import SegmentCache
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.lane.read.live import LiveTail


def _catalog(tmp_path: Path, cache: SegmentCache | None = None) -> LaneCatalog:
    layout, w = writer(tmp_path)
    r = raw(list(range(6)))
    decoded = pa.table(
        {
            "x": pa.array(range(10, 16), pa.int64()),
            COLS.offset: r.column(COLS.offset),
            COLS.position: r.column(COLS.position),
            COLS.partition: r.column(COLS.partition),
            COLS.decode_error: pa.nulls(6, pa.string()),
        }
    )
    w.write("t", 0, r, decoded, 0, 6)
    return LaneCatalog(layout, COLS, LiveTail(), cache=cache)


def _read(catalog: LaneCatalog, **ticket: object) -> tuple[pa.Schema, pa.Table]:
    body = {"topic": "t", "lane": "decoded", "metadata": "all", "end": "now", **ticket}
    plan = plan_read(catalog, parse_ticket(json.dumps(body).encode()))
    table = pa.Table.from_batches(
        list(read_stream(catalog, plan, lambda: False)), schema=plan.schema
    )
    return plan.shape_schema, table


def test_a_projected_read_shapes_only_what_it_sends_or_filters_by(tmp_path: Path) -> None:
    catalog = _catalog(tmp_path)
    key, stamp = COLS.source("key"), COLS.emit_ts
    shaped, got = _read(
        catalog,
        columns=["x", key],
        filter=[{"column": COLS.offset, "op": ">=", "value": 2}],
    )
    # The full schema's order, only the sent and the filtered columns: no null column is
    # built for the twenty metadata fields the read drops (nor the emit time).
    assert shaped.names == ["x", COLS.offset, key]
    assert stamp not in shaped.names
    whole_schema, whole = _read(catalog)
    assert len(whole_schema) > 20
    want = whole.filter(pc.greater_equal(whole.column(COLS.offset), 2)).select(["x", key])
    assert got.equals(want)
    assert got.column("x").to_pylist() == [12, 13, 14, 15]


def test_an_unprojected_read_is_shaped_whole(tmp_path: Path) -> None:
    shaped, got = _read(_catalog(tmp_path))
    assert shaped.names == got.schema.names
    assert got.column(COLS.emit_ts).null_count == 0  # stamped when sent


@pytest.mark.parametrize("cached", [False, True], ids=["parquet", "cache"])
def test_a_read_whose_raw_twin_gives_only_the_emit_time_keeps_every_row(
    tmp_path: Path, cached: bool
) -> None:
    # Every column asked for but the emit time is in the decoded file: the raw twin is
    # read for no column, and still stands for its rows.
    cache = SegmentCache(64 * 1024 * 1024) if cached else None
    catalog = _catalog(tmp_path, cache)
    if cache is not None:
        _read(catalog)  # a whole read puts both files in the cache
        assert cache.nbytes > 0
    _, got = _read(catalog, columns=["x", COLS.emit_ts], start={"offset": 1})
    assert got.column("x").to_pylist() == [11, 12, 13, 14, 15]
    assert got.column(COLS.emit_ts).null_count == 0
