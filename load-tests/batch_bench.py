"""``twg batch`` benchmark: files through the pipeline against a bare pyarrow copy.

Writes ``--records`` order-like rows as ``--files`` Parquet files and as many CSV files,
then, per format, interleaved and best of ``--repeats``:

  (a) baseline: ``pyarrow.dataset`` reads the files and ``pyarrow.dataset.write_dataset``
      writes them as Parquet (pyarrow's defaults) — what a user's own script would do;
  (b) thalweg:  ``twg batch``'s engine (``BatchRun``, in this process) reads the same
      files into the raw lane (locators) and the decoded lane (the rows), fsyncs every
      segment and commits each file's rows to the manifest — all included.

``--codec zstd`` (or ``snappy``) writes both with one codec: like for like, since by
default (a) writes snappy and (b) zstd-1, which costs more CPU and makes smaller files.

Prints seconds, rows/s and the ratio (a)/(b) time — (b)'s throughput as a share of
(a)'s. Not a test: machines here are noisy (2 shared cores), so only the ratio within
one run means much.

    python load-tests/batch_bench.py --records 5000000
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from thalweg.config.load import parse_config
from thalweg.engine.batch import BatchRun, files_source


def make_rows(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    customers = np.array([f"customer-{i:05d}" for i in range(5000)])
    statuses = np.array(["new", "paid", "shipped", "returned"])
    return pa.table(
        {
            "order_id": pa.array(np.arange(n, dtype=np.int64) + seed * n),
            "customer": pa.array(customers[rng.integers(0, len(customers), n)]),
            "amount": pa.array(np.round(rng.random(n) * 500, 2)),
            "quantity": pa.array(rng.integers(1, 20, n).astype(np.int32)),
            "status": pa.array(statuses[rng.integers(0, 4, n)]),
            "created_at": pa.array(
                (1_700_000_000_000 + np.arange(n, dtype=np.int64) * 7).astype("datetime64[ms]")
            ),
        }
    )


def write_inputs(root: Path, records: int, files: int) -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {"parquet": [], "csv": []}
    (root / "parquet").mkdir(parents=True)
    (root / "csv").mkdir(parents=True)
    per = records // files
    for i in range(files):
        t = make_rows(per, i)
        p = root / "parquet" / f"part-{i}.parquet"
        pq.write_table(t, p)
        c = root / "csv" / f"part-{i}.csv"
        pacsv.write_csv(t, c)
        out["parquet"].append(p)
        out["csv"].append(c)
    return out


def baseline(paths: list[Path], fmt: str, out: Path, codec: str | None = None) -> tuple[float, int]:
    started = time.perf_counter()
    dataset = ds.dataset([str(p) for p in paths], format=fmt)
    options = None
    if codec is not None:  # the lane's codec (zstd at level 1), not pyarrow's snappy
        level = 1 if codec == "zstd" else None
        options = ds.ParquetFileFormat().make_write_options(
            compression=codec, compression_level=level
        )
    ds.write_dataset(
        dataset,
        out,
        format="parquet",
        file_options=options,
        existing_data_behavior="overwrite_or_ignore",
    )
    took = time.perf_counter() - started
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in out.rglob("*.parquet"))
    return took, rows


def thalweg(
    paths: list[Path], data: Path, fsync: bool = True, codec: str | None = None
) -> tuple[float, int]:
    lane: dict[str, object] = {"fsync": fsync}
    if codec is not None:
        lane["compression"] = codec
    cfg = parse_config(
        {
            "gateway": {"data_dir": str(data)},
            "raw_lane": lane,
            "sources": [{"kind": "files", "name": "files", "topics": ["orders"]}],
        }
    )
    source = files_source(cfg, None, None, [str(p) for p in paths])
    started = time.perf_counter()
    summary = asyncio.run(BatchRun(cfg, source).run())
    took = time.perf_counter() - started
    assert summary.ok, summary
    assert summary.dead_letters == 0, summary
    return took, summary.rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--files", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--formats", default="parquet,csv")
    ap.add_argument("--no-fsync", action="store_true", help="raw_lane.fsync = false")
    ap.add_argument(
        "--codec",
        choices=["snappy", "zstd"],
        help="one codec for both sides (zstd at level 1, as the lanes write it); default: "
        "each its own default (pyarrow: snappy, the lanes: zstd-1)",
    )
    args = ap.parse_args()
    print(f"python {platform.python_version()}, pyarrow {pa.__version__}, {args.records:,} rows")
    with tempfile.TemporaryDirectory(prefix="batch-bench-") as tmp:
        root = Path(tmp)
        inputs = write_inputs(root / "in", args.records, args.files)
        for fmt in args.formats.split(","):
            size = sum(p.stat().st_size for p in inputs[fmt]) / 1e6
            best_a = best_b = float("inf")
            for i in range(args.repeats):
                out_a, out_b = root / f"a-{fmt}-{i}", root / f"b-{fmt}-{i}"
                a, rows_a = baseline(inputs[fmt], fmt, out_a, args.codec)
                b, rows_b = thalweg(inputs[fmt], out_b, not args.no_fsync, args.codec)
                assert rows_a == rows_b == args.records // args.files * args.files
                best_a, best_b = min(best_a, a), min(best_b, b)
                shutil.rmtree(out_a)
                shutil.rmtree(out_b)
                print(f"  {fmt} run {i}: baseline {a:.2f}s, thalweg {b:.2f}s ({a / b:.2f}x)")
            rows = args.records // args.files * args.files
            print(
                f"{fmt} ({size:,.0f} MB in {args.files} files): baseline {best_a:.2f}s "
                f"({rows / best_a:,.0f} rows/s), twg batch {best_b:.2f}s "
                f"({rows / best_b:,.0f} rows/s): ratio {best_a / best_b:.2f}x"
            )


if __name__ == "__main__":
    main()
