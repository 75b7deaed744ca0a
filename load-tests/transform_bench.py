"""Transform benchmark: the pipeline's nodes against the same work done bare.

On N decoded records (in memory, cut into 50k-row segments as the feeder reads them),
in one run:

  (a) a SQL node (``Chain.apply``: plan cache, locator order) against the same query run
      by DataFusion directly on the same batches (register, query, collect);
  (b) a sidecar echo node (``SidecarClient``: 10k-row batches, 4 in flight, locators
      checked) against a bare ``pyarrow.flight`` ``do_exchange`` echo client writing the
      same batches with the same in-flight window, both to the same echo sidecar;
  (c) a WebAssembly function (``double``, tests/data/udfs/math.wat, called a column at
      a time) against ``pyarrow.compute.multiply`` in the same query;
  (d) a sidecar back from a 6 s outage: the seconds from its restart to the first batch
      the node's client gets through, calling as the node's feeder does (again after the
      error's ``retry_after_s``: the breaker's half-open probe).

    python load-tests/transform_bench.py --records 1000000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from datafusion import SessionContext
from pyarrow import flight

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from thalweg.config.pipeline import NodeConfig, PipelineConfig, UdfConfig  # noqa: E402
from thalweg.embedded import free_port  # noqa: E402
from thalweg.pipeline.dag import Chain, Dag, expand_prefix_glob  # noqa: E402
from thalweg.pipeline.udf import WasmUdf  # noqa: E402
from thalweg.records.columns import MetadataColumns  # noqa: E402
from thalweg.sidecars import SidecarClient, SidecarUnavailableError  # noqa: E402
from thalweg_client.sidecar import Sidecar  # noqa: E402

COLS = MetadataColumns("_twg_")
SEGMENT = 50_000
QUERY = "select order_id, amount * 2 as doubled, customer, _twg_* from input where amount > 10"


class Echo(Sidecar):
    def transform(self, command: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch


def segments(n: int) -> list[pa.Table]:
    out = []
    for first in range(0, n, SEGMENT):
        i = np.arange(first, min(n, first + SEGMENT), dtype=np.int64)
        locators = {f.name: pa.nulls(len(i), f.type) for f in COLS.locator_fields}
        locators["_twg_position"] = pa.array(i)
        locators["_twg_source_offset"] = pa.array(i)
        locators["_twg_record_id"] = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(16),
            len(i),
            [None, pa.py_buffer(np.random.default_rng(first).bytes(16 * len(i)))],
        )
        out.append(
            pa.table(
                {
                    "order_id": i,
                    "amount": i % 100,
                    "customer": pa.array([f"c{x % 997}" for x in i]),
                    **locators,
                }
            )
        )
    return out


def timed(f: object, tables: list[pa.Table]) -> tuple[float, int]:
    t0 = time.perf_counter()
    rows = sum(f(t).num_rows for t in tables)  # type: ignore[operator]
    return time.perf_counter() - t0, rows


def compare(
    bare: object, ours: object, tables: list[pa.Table], rounds: int = 5
) -> tuple[float, float]:
    """Median seconds of each side over ``rounds`` alternating passes (one pass is a
    tenth of a second here: a single one is at the mercy of the shared cores)."""
    a_times, b_times = [], []
    for _ in range(rounds):
        a, rows_a = timed(bare, tables)
        b, rows_b = timed(ours, tables)
        assert rows_a == rows_b
        a_times.append(a)
        b_times.append(b)
    return statistics.median(a_times), statistics.median(b_times)


def bare_sql(query: str, udfs: list[object] | None = None) -> object:
    ctx = SessionContext()
    for u in udfs or []:
        ctx.register_udf(u)

    def run(t: pa.Table) -> pa.Table:
        ctx.register_record_batches("input", [t.to_batches()])
        try:
            return ctx.sql(query).to_arrow_table()
        finally:
            ctx.deregister_table("input")

    return run


def bare_exchange(location: str) -> object:
    client = flight.connect(location)
    descriptor = flight.FlightDescriptor.for_command(b"echo")

    def run(t: pa.Table) -> pa.Table:
        batches = t.combine_chunks().to_batches(max_chunksize=10_000)
        writer, reader = client.do_exchange(descriptor)
        got = []
        with writer:
            writer.begin(t.schema)
            for i, b in enumerate(batches):
                writer.write_batch(b)
                if i + 1 - len(got) >= 4:
                    got.append(reader.read_chunk().data)
            writer.done_writing()
            while len(got) < len(batches):
                got.append(reader.read_chunk().data)
        return pa.Table.from_batches(got)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1_000_000)
    args = ap.parse_args()
    tables = segments(args.records)
    node = {"name": "n", "from": "t", "query": QUERY}
    chain = Chain(Dag.of(PipelineConfig.model_validate({"nodes": [node]})), "n", COLS)
    results = {}
    expanded = expand_prefix_glob(QUERY, tables[0].schema, COLS)  # DataFusion has no glob
    results["(a) SQL node"] = compare(bare_sql(expanded), lambda t: chain.apply(t).rows, tables)

    server = Echo()
    location = f"grpc://127.0.0.1:{server.port}"
    try:
        side = NodeConfig.model_validate(
            {"name": "s", "from": "t", "sidecar": location, "command": "echo"}
        )
        results["(b) sidecar echo node"] = compare(
            bare_exchange(location), SidecarClient(side, COLS), tables
        )
    finally:
        server.shutdown()

    wasm = WasmUdf(
        UdfConfig.model_validate(
            {
                "name": "double",
                "module": ROOT / "tests/data/udfs/math.wat",
                "args": ["int64"],
                "returns": "int64",
            }
        )
    )
    a, _ = timed(bare_sql("select amount * 2 as d, _twg_position from input"), tables)
    b, _ = timed(
        bare_sql("select double(amount) as d, _twg_position from input", [wasm.udf]), tables
    )
    results["(c) WASM double vs compute"] = (a, b)

    recovered = outage_recovery(tables[0].slice(0, 1000), outage_s=6.0)

    n = args.records
    print(f"records={n:,} segments of {SEGMENT:,}")
    for name, (a, b) in results.items():
        print(
            f"{name:28s} bare {n / a:>12,.0f} rec/s   thalweg {n / b:>12,.0f} rec/s   "
            f"ratio {a / b:.3f}x"
        )
    print(f"(d) sidecar back after a 6 s outage: rows flow {recovered:.2f} s after its restart")


def outage_recovery(table: pa.Table, outage_s: float) -> float:
    """Seconds from an echo sidecar's restart (after ``outage_s`` down, on a timer of its
    own) to the first call the node's client gets through, called as the feeder calls
    a down sink (again after the error's ``retry_after_s``)."""
    port = free_port()
    location = f"grpc://127.0.0.1:{port}"
    side = NodeConfig.model_validate(
        {"name": "s", "from": "t", "sidecar": location, "command": "echo"}
    )
    client = SidecarClient(side, COLS)
    servers = [Echo(location)]
    client(table)
    servers[0].shutdown()
    restarted: list[float] = []

    def back() -> None:
        servers.append(Echo(location))
        restarted.append(time.monotonic())

    timer = threading.Timer(outage_s, back)
    timer.start()
    try:
        while True:
            try:
                client(table)
            except SidecarUnavailableError as exc:
                time.sleep(min(exc.retry_after_s, 30.0))  # as recovery.feeder waits
                continue
            if restarted:
                return time.monotonic() - restarted[0]
    finally:
        timer.join()
        servers[-1].shutdown()


if __name__ == "__main__":
    main()
