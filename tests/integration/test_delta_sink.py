"""The Delta Lake sink (``sinks/delta.py``) read back by a reader we did not write:
DuckDB's ``delta`` extension (delta-kernel-rs, a second implementation of the protocol,
loaded from the file the ``duckdb-extension-delta`` wheel installs). The behaviours every
destination shares are the contract suite's (``test_destination_contract.py``); here what
is Delta's own: the coverage in the commit log across a compaction commit and over
skipped offsets, an added column, the application transactions, an upsert's merge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from tests.helpers import duckdb_with, feeder_pass, write_segment
from thalweg.config import parse_config
from thalweg.config.models import ThalwegConfig
from thalweg.records.columns import MetadataColumns
from thalweg.sinks.delta import DeltaSink
from thalweg.verify import verify

pytestmark = pytest.mark.integration

COLS = MetadataColumns()


def _duckdb() -> duckdb.DuckDBPyConnection:
    """DuckDB with its delta extension (delta-kernel-rs), loaded from the wheel's file."""
    con: duckdb.DuckDBPyConnection = duckdb_with("delta")
    return con


def _config(data: Path, **sink: Any) -> ThalwegConfig:
    return parse_config(
        {
            "gateway": {"data_dir": str(data)},
            "sources": [
                {"name": "k", "kind": "kafka", "bootstrap_servers": "127.0.0.1:9", "topics": ["t"]}
            ],
            "sinks": [{"name": "d", "kind": "delta", "topics": ["t"], **sink}],
        }
    )


def test_appended_rows_read_by_duckdb_each_once_with_their_metadata(tmp_path: Path) -> None:
    for p in range(2):
        write_segment(tmp_path, "t", p, range(0, 50), 0, payload={"n": pa.array(range(50))})
    cfg = _config(tmp_path)
    assert feeder_pass(cfg, "d").positions == 100
    table = str(tmp_path / "sinks" / "d" / "t")
    got = _duckdb().execute(
        f'SELECT count(*), count(DISTINCT "{COLS.record_id}"), sum(n), '
        f"count(DISTINCT \"{COLS.partition}\") FROM delta_scan('{table}')"
    )
    assert got.fetchall() == [(100, 100, 2 * sum(range(50)), 2)]
    # The application transaction per partition: the last position landed.
    delta = DeltaTable(table)
    assert [delta.transaction_version(f"twg:d:t:{p}") for p in range(2)] == [49, 49]


def test_the_coverage_is_read_back_across_a_compaction_and_over_skipped_offsets(
    tmp_path: Path,
) -> None:
    write_segment(tmp_path, "t", 0, range(0, 30), 0, payload={"n": pa.array(range(30))})
    cfg = _config(tmp_path)
    feeder_pass(cfg, "d")
    write_segment(tmp_path, "t", 0, range(30, 60), 30, payload={"n": pa.array(range(30, 60))})
    feeder_pass(cfg, "d")
    table = str(tmp_path / "sinks" / "d" / "t")
    DeltaTable(table).optimize.compact()  # a commit of another writer, with no coverage
    assert DeltaTable(table).history(limit=1)[0]["operation"] == "OPTIMIZE"
    sink = DeltaSink(cfg.sinks[0], tmp_path)  # type: ignore[arg-type]
    assert sink.holds([COLS.position]).coverage == {("t", 0, 0): [(0, 60)]}
    assert feeder_pass(cfg, "d").positions == 0  # nothing is written twice
    # Positions with no row for the sink (skipped offsets: a segment covering from 60
    # whose first record is 70) are covered with the row at 70, in one commit.
    write_segment(tmp_path, "t", 0, range(70, 71), 60, payload={"n": pa.array([70])})
    files = len(DeltaTable(table).file_uris())
    done = feeder_pass(cfg, "d")
    assert (done.positions, done.rows) == (11, 1)
    assert len(DeltaTable(table).file_uris()) == files + 1
    assert sink.holds([COLS.position]).coverage == {("t", 0, 0): [(0, 71)]}
    assert _duckdb().execute(f"SELECT count(*) FROM delta_scan('{table}')").fetchone() == (61,)


def test_an_added_column_evolves_the_table(tmp_path: Path) -> None:
    write_segment(tmp_path, "t", 0, range(0, 10), 0, payload={"n": pa.array(range(10))})
    cfg = _config(tmp_path)
    feeder_pass(cfg, "d")
    later = {"n": pa.array(range(10, 20)), "tag": pa.array([f"x{i}" for i in range(10)])}
    write_segment(tmp_path, "t", 0, range(10, 20), 10, payload=later)
    feeder_pass(cfg, "d")
    table = str(tmp_path / "sinks" / "d" / "t")
    rows = (
        _duckdb()
        .execute(f"SELECT count(*), count(tag), min(tag) FROM delta_scan('{table}')")
        .fetchall()
    )
    assert rows == [(20, 10, "x0")]


def test_an_upsert_table_read_by_duckdb_is_the_fold(tmp_path: Path) -> None:
    # Five ids, each updated again and again; id 4's last event is a delete.
    n = 40
    ids = [i % 5 for i in range(n)]
    payload = {
        "id": pa.array(ids, pa.int64()),
        "v": pa.array([f"v{i}" for i in range(n)]),
        "__deleted": pa.array([i == 39 for i in range(n)]),
    }
    write_segment(tmp_path, "t", 0, range(n), 0, payload=payload)
    cfg = _config(tmp_path, mode="upsert", key=["id"], commit_rows=7)
    feeder_pass(cfg, "d", end=20)  # two passes: the second merges into the first's rows
    feeder_pass(cfg, "d")
    table = str(tmp_path / "sinks" / "d" / "t")
    got = _duckdb().execute(f"SELECT id, v FROM delta_scan('{table}') ORDER BY id").fetchall()
    assert got == [(0, "v35"), (1, "v36"), (2, "v37"), (3, "v38")]


def test_tables_on_s3_each_record_once_after_a_lost_coverage_store(
    moto: Any, tmp_path: Path
) -> None:
    """``uri = "s3://…"`` on moto: delta-rs writes the table and its log there, the
    coverage comes back from the commit log there (the local coverage store removed, as
    a new host has none), and nothing is written twice."""
    import uuid

    from tests.moto_server import ACCESS_KEY, REGION, SECRET_KEY

    name = f"delta-{uuid.uuid4().hex[:8]}"
    moto.client().create_bucket(Bucket=name)
    options = {
        "AWS_ENDPOINT_URL": moto.endpoint,
        "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_ALLOW_HTTP": "true",
    }
    for p in range(2):
        write_segment(tmp_path, "t", p, range(0, 40), 0, payload={"n": pa.array(range(40))})
    cfg = _config(tmp_path, uri=f"s3://{name}/lake", storage_options=options)
    assert feeder_pass(cfg, "d").positions == 80
    (tmp_path / "coverage" / "d.json").unlink()
    again = feeder_pass(cfg, "d")
    assert (again.positions, again.rows) == (0, 0)
    table = DeltaTable(f"s3://{name}/lake/t", storage_options=options)
    rows = table.to_pyarrow_table(columns=[COLS.record_id])
    assert rows.num_rows == 80 and len(set(rows.column(0).to_pylist())) == 80
    keys = [o["Key"] for o in moto.client().list_objects_v2(Bucket=name)["Contents"]]
    assert any("_delta_log/" in k for k in keys) and not (tmp_path / "sinks").exists()


def test_small_files_are_compacted_and_vacuumed_every_n_commits(tmp_path: Path) -> None:
    """A flush is a commit and a file; every ``compact_every_commits`` the table's files
    are compacted and the replaced ones vacuumed — the rows, the coverage and the
    record-once check unchanged."""
    for first in range(0, 60, 10):
        rows = {"n": pa.array(range(first, first + 10))}
        write_segment(tmp_path, "t", 0, range(first, first + 10), first, payload=rows)
    cfg = _config(tmp_path, commit_rows=10, compact_every_commits=3, vacuum_retention_hours=0)
    cfg = cfg.model_copy(
        update={"recovery": cfg.recovery.model_copy(update={"window_records": 10})}
    )
    assert feeder_pass(cfg, "d").flushes >= 6
    table = str(tmp_path / "sinks" / "d" / "t")
    operations = [c["operation"] for c in DeltaTable(table).history()]
    assert operations.count("OPTIMIZE") == 2, operations
    assert "VACUUM END" in operations, operations
    # Six commits of one file each became one file; the replaced files are gone.
    assert len(DeltaTable(table).file_uris()) == 1
    on_disk = list(Path(table).glob("*.parquet"))
    assert len(on_disk) == 1, on_disk
    sink = DeltaSink(cfg.sinks[0], tmp_path)  # type: ignore[arg-type]
    assert sink.holds([COLS.position]).coverage == {("t", 0, 0): [(0, 60)]}
    assert feeder_pass(cfg, "d").positions == 0
    got = _duckdb().execute(
        f"SELECT count(*), count(DISTINCT \"{COLS.record_id}\") FROM delta_scan('{table}')"
    )
    assert got.fetchall() == [(60, 60)]


def test_a_table_dropped_under_an_open_sink_claims_only_what_it_is_made_with(
    tmp_path: Path,
) -> None:
    import asyncio
    import shutil

    from thalweg.sinks.base import Span

    cfg = _config(tmp_path)
    sink = DeltaSink(cfg.sinks[0], tmp_path)  # type: ignore[arg-type]

    def rows(first: int, end: int) -> pa.Table:
        return pa.table(
            {
                "n": pa.array(range(first, end), pa.int64()),
                COLS.partition: pa.array([0] * (end - first), pa.int32()),
                COLS.position: pa.array(range(first, end), pa.int64()),
            }
        )

    async def run() -> None:
        await sink.open()
        await sink.write(rows(0, 10), Span("t", 0, 0, 0, 10))
        await sink.flush()
        shutil.rmtree(tmp_path / "sinks" / "d" / "t")  # dropped behind the open sink
        await sink.write(rows(10, 20), Span("t", 0, 0, 10, 20))
        await sink.flush()
        await sink.close()

    asyncio.run(run())
    held = sink.holds([COLS.position])
    assert held.coverage == {("t", 0, 0): [(10, 20)]}  # not 0-20: those rows went
    table = held.rows["t"]
    assert table is not None and sorted(table.column(COLS.position).to_pylist()) == list(
        range(10, 20)
    )


def test_a_routed_flush_cut_before_its_control_commit_lands_each_row_once(
    tmp_path: Path,
) -> None:
    """``table = "t_{shard}"``: a flush lands table by table, then in the control
    record. Cut between the two (the control table's last commit file removed, as a
    crash before that commit leaves it), the sink reopens short of the flush, the lane
    replays it, and each table — which already holds its rows — keeps them once; DuckDB's
    reader sees each position once in the table its shard names."""
    for first in (0, 30):
        positions = range(first, first + 30)
        payload = {"n": pa.array(positions), "shard": pa.array([f"s{p % 3}" for p in positions])}
        write_segment(tmp_path, "t", 0, positions, first, payload=payload)
    cfg = _config(tmp_path, table="t_{shard}", commit_rows=30)
    feeder_pass(cfg, "d", end=30)
    feeder_pass(cfg, "d")
    base = tmp_path / "sinks" / "d"
    assert sorted(p.name for p in base.iterdir()) == ["_thalweg_coverage", "t_s0", "t_s1", "t_s2"]
    sink = DeltaSink(cfg.sinks[0], tmp_path)  # type: ignore[arg-type]
    assert sink.holds([COLS.position]).coverage == {("t", 0, 0): [(0, 60)]}
    log = sorted((base / "_thalweg_coverage" / "_delta_log").glob("*.json"))
    log[-1].unlink()  # the crash: the second flush's control commit never written
    assert sink.holds([COLS.position]).coverage == {("t", 0, 0): [(0, 30)]}
    again = feeder_pass(cfg, "d")
    assert again.positions == 30  # replayed from the lane
    con = _duckdb()
    for s in range(3):
        got = con.execute(f"SELECT n FROM delta_scan('{base / f't_s{s}'}') ORDER BY n").fetchall()
        assert [n for (n,) in got] == [p for p in range(60) if p % 3 == s]
    assert sink.holds([COLS.position]).coverage == {("t", 0, 0): [(0, 60)]}
    report = verify(cfg, broker=False, sink="d")
    assert report.ok, report.as_text()
