"""The Iceberg sink on its own: coverage rides in the snapshot summary of the same commit
(a flush of spans without rows still records them), partition transforms, type
adjustments, and the table's record trusted on open."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

from thalweg.config.sinks import IcebergSinkConfig
from thalweg.sinks.base import SinkSchemaError, SinkState, Span
from thalweg.sinks.iceberg import COVERAGE_PREFIX, IcebergSink

pytestmark = pytest.mark.integration


def rows(*positions: int) -> pa.Table:
    return pa.table(
        {
            "_twg_record_id": pa.array([p.to_bytes(16, "big") for p in positions], pa.binary(16)),
            "_twg_position": pa.array(positions, pa.int64()),
            "_twg_source_timestamp": pa.array(
                [1_764_000_000_000 + p * 3_600_000 for p in positions], pa.timestamp("ms", tz="UTC")
            ),
            "qty": pa.array([p % 5 for p in positions], pa.uint16()),
        }
    )


def make(tmp_path: Path) -> IcebergSink:
    cfg = IcebergSinkConfig(
        name="lake",
        kind="iceberg",
        topics=["orders"],
        partition_by=["day(_twg_source_timestamp)"],
    )
    return IcebergSink(cfg, tmp_path)


def test_coverage_is_committed_with_the_rows_and_trusted_on_open(tmp_path: Path) -> None:
    sink = make(tmp_path)

    async def go() -> None:
        assert (await sink.open()) is not None
        await sink.write(rows(0, 1, 2), Span("orders", 0, 0, 0, 3))
        await sink.write(rows(30), Span("orders", 1, 0, 30, 31))
        await sink.flush()
        # A span whose records were all dead-lettered: no rows, still covered.
        await sink.write(rows().slice(0, 0), Span("orders", 0, 0, 3, 10))
        await sink.flush()

    asyncio.run(go())
    table = sink._table("orders")
    assert table is not None
    data = table.scan().to_arrow()
    assert sorted(data.column("_twg_position").to_pylist()) == [0, 1, 2, 30]
    # Types Iceberg lacks were mapped: ms → µs, uint16 → int32.
    assert data.schema.field("_twg_source_timestamp").type == pa.timestamp("us", tz="UTC")
    assert data.schema.field("qty").type == pa.int32()
    assert [f.transform.__class__.__name__ for f in table.spec().fields] == ["DayTransform"]
    summary = table.current_snapshot().summary  # type: ignore[union-attr]
    key = COVERAGE_PREFIX + "lake"
    assert summary is not None and key in summary.additional_properties
    assert table.properties[key] == summary.additional_properties[key]
    landed = asyncio.run(make(tmp_path).open())
    assert landed is not None
    assert landed.ranges == {("orders", 0, 0): [(0, 10)], ("orders", 1, 0): [(30, 31)]}


def test_columns_are_added_and_types_widened_not_changed(tmp_path: Path) -> None:
    sink = make(tmp_path)
    wider = rows(5).append_column("note", pa.array(["new"]))
    wider = wider.set_column(3, "qty", pa.array([7], pa.int64()))

    async def go(t: pa.Table, start: int) -> None:
        await sink.write(t, Span("orders", 0, 0, start, start + t.num_rows))
        await sink.flush()

    asyncio.run(sink.open())
    asyncio.run(go(rows(4), 4))
    asyncio.run(go(wider, 5))
    table = sink._table("orders")
    assert table is not None
    schema = table.schema().as_arrow()
    assert schema.field("qty").type == pa.int64() and "note" in schema.names
    bad = rows(6).set_column(3, "qty", pa.array(["x"]))
    with pytest.raises(SinkSchemaError):
        asyncio.run(go(bad, 6))
    assert sink.health().state is SinkState.DEGRADED
    fresh = sink._table("orders")
    assert fresh is not None and fresh.scan().to_arrow().num_rows == 2  # nothing committed


def test_a_table_rolled_back_claims_only_what_its_snapshot_holds(tmp_path: Path) -> None:
    sink = make(tmp_path)

    async def go(positions: list[int]) -> None:
        await sink.write(rows(*positions), Span("orders", 0, 0, positions[0], positions[-1] + 1))
        await sink.flush()

    asyncio.run(sink.open())
    asyncio.run(go([0, 1]))
    table = sink._table("orders")
    assert table is not None and table.current_snapshot() is not None
    first = table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    asyncio.run(go([2, 3]))
    table = sink._table("orders")
    assert table is not None
    table.manage_snapshots().set_current_snapshot(snapshot_id=first).commit()
    landed = asyncio.run(make(tmp_path).open())
    assert landed is not None and landed.ranges == {("orders", 0, 0): [(0, 2)]}
