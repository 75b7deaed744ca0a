"""Flight SQL benchmark: queries through the gateway against DataFusion on the same files.

Writes ``--records`` order-like rows as Thalweg lane segments (the gateway's own
SegmentWriter: raw + decoded Parquet, 4 partitions, 500k-row segments), then runs each
query, interleaved and best of ``--repeats``:

  (a) baseline: DataFusion (the same library the gateway plans with) straight on the
      decoded lane's Parquet files, in this process, result collected as Arrow;
  (b) thalweg:  ADBC's Flight SQL driver (``adbc-driver-flightsql``) against the
      gateway's Flight server over loopback, ``fetch_arrow_table`` — planning twice,
      the snapshot of hard links, the result over gRPC, all included.

Queries: an aggregate over every row, the same aggregate on one partition (segment
selection), and a filtered scan returning about 1% of the rows. Prints seconds, rows/s
and the ratio (b)/(a) per query. Not a test: machines here are noisy (2 shared cores),
so only the ratio within one run means much.

    python load-tests/sql_bench.py --records 5000000
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
from datafusion import SessionContext

sys.path.insert(0, str(Path(__file__).parent))
from flight_bench import TOPIC, write_rows
from thalweg.flight.server import GatewayFlightServer
from thalweg.lane.layout import LaneLayout
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.lane.read.live import LiveTail
from thalweg.ops.metrics import Metrics
from thalweg.records.columns import MetadataColumns

QUERIES = {
    "aggregate": "select customer, sum(amount) as total, count(*) as n from {t} group by customer",
    "aggregate_one_partition": (
        "select customer, sum(amount) as total from {t} "
        "where _twg_source_partition = 1 group by customer"
    ),
    "filtered_scan": (
        "select order_id, customer, amount, created_at from {t} "
        "where quantity = 3 and amount > 1355"
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}, {args.records:,} records")
    with tempfile.TemporaryDirectory(prefix="twg-sql-bench-") as d:
        root = Path(d)
        t = time.perf_counter()
        rows = write_rows(root, args.records)
        print(f"wrote {rows:,} rows of lane segments in {time.perf_counter() - t:.1f}s")
        catalog = LaneCatalog(LaneLayout(root), MetadataColumns(), LiveTail())
        server = GatewayFlightServer("grpc://127.0.0.1:0", catalog, Metrics())
        threading.Thread(target=server.serve, daemon=True).start()
        ctx = SessionContext()
        ctx.register_parquet("orders", str(root / "decoded"))
        conn = flight_sql.connect(server.url, autocommit=True)
        cur = conn.cursor()

        def baseline(sql: str) -> int:
            return int(ctx.sql(sql.format(t="orders")).to_arrow_table().num_rows)

        def gateway(sql: str) -> int:
            cur.execute(sql.format(t=TOPIC))
            return int(cur.fetch_arrow_table().num_rows)

        best: dict[tuple[str, str], float] = {}
        sizes: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, sql in QUERIES.items():
                for who, run in (("datafusion", baseline), ("thalweg", gateway)):
                    started = time.perf_counter()
                    n = run(sql)
                    took = time.perf_counter() - started
                    assert sizes.setdefault(name, n) == n, (name, who, n, sizes[name])
                    best[(name, who)] = min(took, best.get((name, who), took))
        cur.close()
        conn.close()
        server.shutdown()
    for name in QUERIES:
        base, ours = best[(name, "datafusion")], best[(name, "thalweg")]
        print(
            f"{name:24s} datafusion {base:6.3f}s  thalweg {ours:6.3f}s  "
            f"({rows / ours:12,.0f} rows/s scanned, {sizes[name]:,} rows out)  "
            f"ratio {base / ours:.2f}x"
        )


if __name__ == "__main__":
    main()
