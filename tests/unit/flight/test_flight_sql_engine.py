"""The SQL engine over real lane files (no broker): snapshots, owners, live rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tests.unit.lane.test_segment_cache import COLS, segment
from thalweg.config.models import FlightSqlConfig, RawLaneConfig
from thalweg.flight.errors import UnavailableError
from thalweg.flight.sql.engine import SqlEngine
from thalweg.flight.sql.handles import Statement
from thalweg.flight.sql.tables import LaneTables
from thalweg.group.owners import OwnerDirectory
from thalweg.lane import LaneLayout, SegmentWriter
from thalweg.lane.read.catalog import Ingesting, LaneCatalog
from thalweg.lane.read.live import LiveEntry, LiveTail


class _DecodedT(Ingesting):
    def decoded_topics(self) -> set[str]:
        return {"t"}


def _lanes(root: Path) -> LaneCatalog:
    """Partition 0 holds offsets 0-49, partition 1 offsets 0-29, both durable."""
    writer = SegmentWriter(LaneLayout(root), COLS, RawLaneConfig(fsync=False))
    for p, n in ((0, 50), (1, 30)):
        raw, dec = segment(list(range(n)))
        raw = raw.set_column(
            raw.schema.get_field_index(COLS.partition),
            COLS.partition,
            pa.array([p] * n, pa.int32()),
        )
        writer.write("t", p, raw, dec, 0, n)
    return LaneCatalog(LaneLayout(root), COLS, LiveTail(), ingesting=_DecodedT())


def _query(engine: SqlEngine, sql: str) -> pa.Table:
    planned = engine.plan(Statement(sql), lambda _t: True)
    return pa.Table.from_batches(list(engine.run(planned, lambda: False)), planned.schema)


def test_another_members_partition_is_refused_unless_the_lane_is_shared(tmp_path: Path) -> None:
    catalog = _lanes(tmp_path)
    owners = OwnerDirectory()
    owners.location = "grpc://me:1"
    owners.publish(1, {"t": {0: "grpc://me:1", 1: "grpc://other:2"}})
    engine = SqlEngine(LaneTables(catalog, owners), FlightSqlConfig())
    with pytest.raises(
        UnavailableError, match=r"t\[1\] is ingested by the gateway at grpc://other:2"
    ):
        _query(engine, "select count(*) as n from t")
    mine = _query(engine, "select count(*) as n from t where _twg_source_partition = 0")
    assert mine.to_pylist() == [{"n": 50}]
    owners.shared_lane = True  # one data_dir for the group: its history is here too
    assert _query(engine, "select count(*) as n from t").to_pylist() == [{"n": 80}]


def test_live_rows_join_history_without_a_gap_or_a_duplicate(tmp_path: Path) -> None:
    catalog = _lanes(tmp_path)
    # Rows 45-59 are live; 45-49 are also durable (the entry outlived its write).
    overlap_raw, overlap_dec = segment(list(range(45, 60)))
    catalog.live.append(
        "t", 0, LiveEntry(45, 59, overlap_raw.combine_chunks().to_batches()[0], overlap_dec)
    )
    catalog.live.mark_durable("t", 0, 50)
    engine = SqlEngine(LaneTables(catalog), FlightSqlConfig())
    got = _query(engine, "select i from t where _twg_source_partition = 0 order by i")
    assert got.column("i").to_pylist() == list(range(60))
