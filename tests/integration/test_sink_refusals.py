"""A value an Iceberg table can never hold (a ``uint64`` above 2**63-1: Iceberg has no
unsigned types, the sink casts to ``long``) among records of a lane written here: the
sink lands every other record, sets those aside in its own dead-letter lane with the
destination's message, covers them, and a second pass writes nothing more (a real
pyiceberg SQL catalog on SQLite; the Postgres case runs against a real server in
``test_sinks.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog

from thalweg.config import parse_config
from thalweg.lane.layout import META_COVERS_FROM, Lane, LaneLayout, segment_name
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders
from thalweg.recovery.refused import SinkDeadLetters

pytestmark = pytest.mark.integration

BIG = 2**64 - 1
COLUMNS = MetadataColumns("_twg_")


def write_segment(layout: LaneLayout, positions: list[int], bad: set[int]) -> None:
    name = segment_name(positions[0], positions[-1])
    pos = pa.array(positions, pa.int64())
    raw = pa.table(
        {"_twg_position": pos, "_twg_source_value": [f"v{p}".encode() for p in positions]}
    ).replace_schema_metadata({META_COVERS_FROM: str(positions[0]).encode()})
    dec = pa.table(
        {
            "n": pa.array([BIG if p in bad else p for p in positions], pa.uint64()),
            "_twg_position": pos,
        }
    )
    for lane, table in ((Lane.RAW, raw), (Lane.DECODED, dec)):
        d = layout.partition_dir(lane, "t", 0)
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, d / name)


def test_an_iceberg_sink_sets_aside_a_value_it_cannot_hold(tmp_path: Path) -> None:
    layout = LaneLayout(tmp_path)
    bad = {7, 1234, 1235}
    write_segment(layout, list(range(1000)), bad)
    write_segment(layout, list(range(1000, 2000)), bad)
    cfg = parse_config(
        {
            "gateway": {"data_dir": str(tmp_path)},
            "sources": [
                {"name": "s", "kind": "kafka", "bootstrap_servers": "127.0.0.1:1", "topics": ["t"]}
            ],
            "sinks": [{"name": "lake", "kind": "iceberg", "topics": ["t"], "metadata": []}],
        }
    )

    async def one_pass() -> tuple[int, int]:
        [f] = build_feeders(cfg, layout, COLUMNS)
        try:
            await f.open()
            s = await f.pass_once(final=True)
            return s.positions, s.lag_after
        finally:
            await f.close()

    assert asyncio.run(one_pass()) == (2000, 0)
    home = (tmp_path / "sinks" / "lake").resolve()
    cat = load_catalog(
        "lake",
        **{
            "type": "sql",
            "uri": f"sqlite:///{home / 'catalog.db'}",
            "warehouse": (home / "warehouse").as_uri(),
        },
    )
    rows = cat.load_table("thalweg.t").scan().to_arrow()
    assert sorted(rows.column("_twg_position").to_pylist()) == [
        p for p in range(2000) if p not in bad
    ]
    held = SinkDeadLetters(layout, "lake", COLUMNS).held("t", 0)
    assert held.tolist() == sorted(bad)
    files = sorted(layout.refused_dir("lake", "t", 0).iterdir())
    refused = pa.concat_tables([pq.read_table(f) for f in files])
    assert refused.column("_twg_source_value").to_pylist() == [
        f"v{p}".encode() for p in sorted(bad)
    ]
    assert set(refused.column("_twg_dlq_reason").to_pylist()) == {"sink_refused"}
    assert all("do not convert" in e for e in refused.column("_twg_dlq_error").to_pylist())
    assert asyncio.run(one_pass()) == (0, 0)  # nothing owed, nothing set aside again
    assert SinkDeadLetters(layout, "lake", COLUMNS).held("t", 0).tolist() == sorted(bad)
