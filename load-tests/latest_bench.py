"""Latest-view benchmark: Thalweg's ``"view": "latest"`` against DuckDB's ``arg_max``
over the same lane files, in one run.

Writes ``--events`` records of a keyed changelog over ``--keys`` keys as Thalweg lane
segments (the gateway's own SegmentWriter: raw + decoded Parquet), ``--partitions``
partitions, a key always in the same partition, about 10 % tombstones (a null value:
the key is deleted until written again). Then, best of ``--repeats``:

  (a) bare:    DuckDB over the same Parquet files — the raw segments give each record's
               key and whether its value is null, the decoded segments its row; per
               (partition, key) ``arg_max(row, position)``, tombstoned keys dropped,
               fetched as Arrow (``to_arrow_table``): what a person would write by
               hand against the lane;
  (b) thalweg: ``thalweg_client.read(topic, view="latest", metadata="none")`` against
               the gateway's Flight server (no memory cache, as a cold read): planning,
               one endpoint per partition read in parallel, the fold as rows arrive.

Both give the same rows (checked: the key set and every row's payload). The ratio
(a)/(b) is the figure. Not a test: machines here are noisy (2 shared cores).

    python load-tests/latest_bench.py --events 1000000 --keys 100000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))

import thalweg_client
from flight_bench import TOPIC, lane_tables
from thalweg.config.models import RawLaneConfig
from thalweg.flight.server import GatewayFlightServer
from thalweg.lane.layout import LaneLayout
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.lane.read.live import LiveTail
from thalweg.lane.writer import SegmentWriter
from thalweg.ops.metrics import Metrics
from thalweg.records.columns import MetadataColumns

SEGMENT_ROWS = 250_000


def changelog(n: int, keys: int, first: int, partition: int, parts: int) -> pa.Table:
    """``n`` events of one partition: keys ``k`` with ``k % parts == partition``, ~10 %
    tombstones, the payload a customer-like row."""
    rng = np.random.default_rng(first * 31 + partition)
    key = rng.integers(0, keys // parts, n, dtype=np.int64) * parts + partition
    i = np.arange(first, first + n, dtype=np.int64)
    return pa.table(
        {
            "id": key,
            "email": pa.array([f"user-{k}@example.com" for k in key.tolist()]),
            "tier": pa.array((i % 5).astype(np.int32)),
            "version": i,
            "_tombstone": pa.array(rng.random(n) < 0.1),
        }
    )


def write_lane(root: Path, events: int, keys: int, parts: int) -> None:
    cols = MetadataColumns()
    writer = SegmentWriter(LaneLayout(root), cols, RawLaneConfig(fsync=False))  # type: ignore[arg-type]
    per = events // parts
    for p in range(parts):
        for first in range(0, per, SEGMENT_ROWS):
            n = min(SEGMENT_ROWS, per - first)
            body = changelog(n, keys, first, p, parts)
            gone = body.column("_tombstone")
            body = body.drop_columns(["_tombstone"])
            raw, dec = lane_tables(cols, p, first, body)
            keyed = pa.array([str(k).encode() for k in body.column("id").to_pylist()])
            value = pc.if_else(gone, pa.scalar(None, pa.binary()), raw.column(cols.value))
            raw = raw.set_column(
                raw.schema.get_field_index(cols.source("key")), cols.source("key"), keyed
            )
            raw = raw.set_column(raw.schema.get_field_index(cols.value), cols.value, value)
            # A tombstone decodes to no payload: its row's fields are null.
            for name in ("id", "email", "tier", "version"):
                at = dec.schema.get_field_index(name)
                nulls = pa.nulls(n, dec.schema.field(name).type)
                dec = dec.set_column(at, name, pc.if_else(gone, nulls, dec.column(name)))
            writer.write(TOPIC, p, raw, dec, first, first + n)


BARE_SQL = """
WITH raw AS (
    SELECT _twg_source_partition AS p, _twg_position AS pos, _twg_source_key AS k,
           _twg_source_value IS NULL AS gone
    FROM read_parquet('{raw}/**/*.parquet')),
dec AS (
    SELECT _twg_source_partition AS p, _twg_position AS pos, id, email, tier, version
    FROM read_parquet('{dec}/**/*.parquet')),
newest AS (
    SELECT p, k, arg_max(pos, pos) AS pos, arg_max(gone, pos) AS gone
    FROM raw WHERE k IS NOT NULL GROUP BY p, k)
SELECT dec.id, dec.email, dec.tier, dec.version
FROM newest JOIN dec USING (p, pos)
WHERE NOT newest.gone
"""


def bare(root: Path) -> tuple[float, pa.Table]:
    sql = BARE_SQL.format(raw=root / "raw", dec=root / "decoded")
    con = duckdb.connect()
    t = time.perf_counter()
    table = con.sql(sql).to_arrow_table()
    return time.perf_counter() - t, table


def thalweg(url: str) -> tuple[float, pa.Table]:
    t = time.perf_counter()
    with thalweg_client.connect(url) as client:
        table = client.read(TOPIC, view="latest", metadata="none")
    return time.perf_counter() - t, table


def same(a: pa.Table, b: pa.Table) -> None:
    cols = ["id", "email", "tier", "version"]
    x = a.select(cols).sort_by("id")
    y = b.select(cols).sort_by("id")
    assert x.num_rows == y.num_rows, (x.num_rows, y.num_rows)
    assert x.equals(y.cast(x.schema)), "the views differ"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="twg-latest-bench-") as d:
        root = Path(d)
        t = time.perf_counter()
        write_lane(root, args.events, args.keys, args.partitions)
        print(f"wrote {args.events:,} events in {time.perf_counter() - t:.1f}s")
        catalog = LaneCatalog(LaneLayout(root), MetadataColumns(), LiveTail())
        server = GatewayFlightServer("grpc://127.0.0.1:0", catalog, Metrics())
        threading.Thread(target=server.serve, daemon=True).start()
        best_a = best_b = float("inf")
        for _ in range(args.repeats):  # alternated, so both see the same machine
            a, want = bare(root)
            b, got = thalweg(server.url)
            same(want, got)
            best_a, best_b = min(best_a, a), min(best_b, b)
        server.shutdown()
    print(
        f"events={args.events:,} keys={args.keys:,} partitions={args.partitions} "
        f"rows={want.num_rows:,} cpus={os.cpu_count()}"
    )
    print(f"duckdb arg_max  {best_a:6.2f} s   {args.events / best_a:>12,.0f} ev/s")
    print(f"thalweg latest  {best_b:6.2f} s   {args.events / best_b:>12,.0f} ev/s")
    print(f"ratio {best_a / best_b:.2f}x")


if __name__ == "__main__":
    main()
