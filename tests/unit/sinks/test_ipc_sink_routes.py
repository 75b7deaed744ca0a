"""An Arrow IPC sink whose ``path`` names a field (``"out/t_{shard}"``): the files of a
range go to the directories their rows name, then the range's control file; a replay
after a cut writes only what a directory does not hold (docs/cdc.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow as pa

from thalweg.config.sinks import ArrowIpcSinkConfig
from thalweg.sinks.arrow_ipc import ArrowIpcSink
from thalweg.sinks.base import Span
from thalweg.sinks.iceberg_coverage import decode_coverage, encode_coverage


def rows(*positions: int) -> pa.Table:
    return pa.table(
        {
            "_twg_record_id": pa.array([p.to_bytes(16, "big") for p in positions], pa.binary(16)),
            "_twg_position": pa.array(positions, pa.int64()),
        }
    )


def test_a_routed_ipc_range_cut_before_its_control_file_is_replayed_once(
    tmp_path: Path,
) -> None:
    """``path = "out/t_{shard}"`` for an Arrow IPC sink: the same two steps. The second
    range's control file lost (a crash before it), the replay arrives with more rows
    (a longer range): each directory writes only the positions it does not hold."""
    out = tmp_path / "out"
    cfg = ArrowIpcSinkConfig(
        name="ipc", kind="arrow_ipc", topics=["orders"], path=out / "t_{shard}"
    )

    def batch(first: int, n: int) -> pa.Table:
        t = rows(*range(first, first + n)).append_column(
            "shard", pa.array([p % 3 for p in range(first, first + n)])
        )
        return t.append_column("_twg_source_partition", pa.array([0] * n, pa.int32()))

    def flush(sink: ArrowIpcSink, first: int, n: int) -> Any:
        async def go() -> Any:
            await sink.open()
            await sink.write(batch(first, n), Span("orders", 0, 0, first, first + n))
            return await sink.flush()

        return asyncio.run(go())

    sink = ArrowIpcSink(cfg, tmp_path)
    flush(sink, 0, 6)
    flush(sink, 6, 6)
    control = out / "_thalweg_coverage" / "topic=orders" / "partition=0"
    second = next(f for f in control.iterdir() if "-00000000000000000006-" in f.name)
    second.unlink()  # the crash: the second range's control file never written
    again = ArrowIpcSink(cfg, tmp_path)
    landed = asyncio.run(again.open())
    assert landed is not None and landed.ranges == {("orders", 0, 0): [(0, 6)]}
    flush(again, 6, 9)  # the replay, with three more records that arrived meanwhile

    def positions(shard: int) -> list[int]:
        got = []
        for f in (out / f"t_{shard}" / "topic=orders" / "partition=0").iterdir():
            with pa.memory_map(str(f)) as source:
                got += pa.ipc.open_file(source).read_all()["_twg_position"].to_pylist()
        return sorted(got)

    assert {s: positions(s) for s in range(3)} == {
        s: [p for p in range(15) if p % 3 == s] for s in range(3)
    }
    reopened = asyncio.run(ArrowIpcSink(cfg, tmp_path).open())
    assert reopened is not None and reopened.ranges == {("orders", 0, 0): [(0, 15)]}


def test_the_coverage_record_reads_back_what_it_wrote() -> None:
    ranges = {("a.b", 0, 0): [(0, 5), (9, 12)], ("a.b", 3, 2): [(7, 8)], ("c", 1, 0): []}
    assert decode_coverage(encode_coverage(ranges)) == ranges
