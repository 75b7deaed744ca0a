"""The Iceberg sink on its own: coverage rides in the snapshot summary of the same commit
(a flush of spans without rows still records them), partition transforms, type
adjustments, and the table's record trusted on open."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

from tests.helpers import iceberg_catalog
from thalweg.config.sinks import IcebergSinkConfig
from thalweg.sinks.base import SinkSchemaError, SinkState, Span
from thalweg.sinks.iceberg import IcebergSink
from thalweg.sinks.iceberg_coverage import COVERAGE_PREFIX

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
    table = sink.table("orders")
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
    table = sink.table("orders")
    assert table is not None
    schema = table.schema().as_arrow()
    assert schema.field("qty").type == pa.int64() and "note" in schema.names
    bad = rows(6).set_column(3, "qty", pa.array(["x"]))
    with pytest.raises(SinkSchemaError):
        asyncio.run(go(bad, 6))
    assert sink.health().state is SinkState.DEGRADED
    fresh = sink.table("orders")
    assert fresh is not None and fresh.scan().to_arrow().num_rows == 2  # nothing committed


def test_a_table_rolled_back_claims_only_what_its_snapshot_holds(tmp_path: Path) -> None:
    sink = make(tmp_path)

    async def go(positions: list[int]) -> None:
        await sink.write(rows(*positions), Span("orders", 0, 0, positions[0], positions[-1] + 1))
        await sink.flush()

    asyncio.run(sink.open())
    asyncio.run(go([0, 1]))
    table = sink.table("orders")
    assert table is not None and table.current_snapshot() is not None
    first = table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    asyncio.run(go([2, 3]))
    table = sink.table("orders")
    assert table is not None
    table.manage_snapshots().set_current_snapshot(snapshot_id=first).commit()
    landed = asyncio.run(make(tmp_path).open())
    assert landed is not None and landed.ranges == {("orders", 0, 0): [(0, 2)]}


def test_a_routed_flush_cut_before_its_control_record_lands_each_row_once(
    tmp_path: Path,
) -> None:
    """``table = "t_{shard}"``: a flush lands table by table, then in the control
    record. Cut between the two (the control record set back to what it held before, as
    a crash before its commit leaves it), the sink reopens short of the flush, the lane
    replays it, and each table — which already holds its rows — keeps them once."""
    from thalweg.sinks import iceberg_routes
    from thalweg.sinks.iceberg_coverage import encode_coverage

    cfg = IcebergSinkConfig(name="lake", kind="iceberg", topics=["orders"], table="t_{shard}")
    first, second = rows(0, 1, 2, 3, 4, 5), rows(6, 7, 8, 9, 10, 11)
    shards = [pa.array([p % 3 for p in range(a, a + 6)]) for a in (0, 6)]
    zero = pa.array([0] * 6, pa.int32())
    first, second = (
        t.append_column("shard", s).append_column("_twg_source_partition", zero)
        for t, s in zip((first, second), shards, strict=True)
    )

    def flush(sink: IcebergSink, t: pa.Table, start: int) -> None:
        async def go() -> None:
            await sink.open()
            await sink.write(t, Span("orders", 0, 0, start, start + 6))
            await sink.flush()

        asyncio.run(go())

    sink = IcebergSink(cfg, tmp_path)
    flush(sink, first, 0)
    flush(sink, second, 6)
    catalog = iceberg_catalog(tmp_path, "lake")
    control = iceberg_routes.control(catalog, "thalweg", create=False)
    assert control is not None
    key = COVERAGE_PREFIX + "lake"
    assert control.properties[key] == encode_coverage({("orders", 0, 0): [(0, 12)]})
    with control.transaction() as tx:  # the crash: the second flush's control commit lost
        tx.set_properties({key: encode_coverage({("orders", 0, 0): [(0, 6)]})})
    again = IcebergSink(cfg, tmp_path)
    landed = asyncio.run(again.open())
    assert landed is not None and landed.ranges == {("orders", 0, 0): [(0, 6)]}
    flush(again, second, 6)  # the replay of what the lane holds past the coverage
    held = {
        n: sorted(
            catalog.load_table(f"thalweg.t_{n}").scan().to_arrow()["_twg_position"].to_pylist()
        )
        for n in range(3)
    }
    assert held == {n: [p for p in range(12) if p % 3 == n] for n in range(3)}
    reopened = asyncio.run(IcebergSink(cfg, tmp_path).open())
    assert reopened is not None and reopened.ranges == {("orders", 0, 0): [(0, 12)]}


def test_two_topics_routed_into_the_same_tables_each_land_once(tmp_path: Path) -> None:
    """``table = "t_{shard}"`` for two topics: a table holds both topics' rows, its own
    coverage and the control record both topics' ranges."""
    from thalweg.sinks import iceberg_routes
    from thalweg.sinks.iceberg_coverage import table_coverage

    cfg = IcebergSinkConfig(name="lake", kind="iceberg", topics=["a", "b"], table="t_{shard}")
    zero = pa.array([0] * 4, pa.int32())

    def batch(topic: str) -> pa.Table:
        t = rows(0, 1, 2, 3).append_column("shard", pa.array([0, 1, 0, 1]))
        t = t.append_column("_twg_source_partition", zero)
        return t.append_column("_twg_source_topic", pa.array([topic] * 4))

    async def go(sink: IcebergSink) -> None:
        await sink.open()
        await sink.write(batch("a"), Span("a", 0, 0, 0, 4))
        await sink.write(batch("b"), Span("b", 0, 0, 0, 4))
        await sink.flush()

    asyncio.run(go(IcebergSink(cfg, tmp_path)))
    catalog = iceberg_catalog(tmp_path, "lake")
    for shard in (0, 1):
        table = catalog.load_table(f"thalweg.t_{shard}")
        got = table.scan().to_arrow().select(["_twg_source_topic", "_twg_position"]).to_pylist()
        want = [(t, p) for t in "ab" for p in range(4) if p % 2 == shard]
        assert sorted((r["_twg_source_topic"], r["_twg_position"]) for r in got) == want
        assert table_coverage(table, "lake") == {("a", 0, 0): [(0, 4)], ("b", 0, 0): [(0, 4)]}
    control = iceberg_routes.control(catalog, "thalweg", create=False)
    assert control is not None
    assert table_coverage(control, "lake") == {("a", 0, 0): [(0, 4)], ("b", 0, 0): [(0, 4)]}
