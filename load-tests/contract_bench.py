"""Contract benchmark: decoding with a data contract against decoding without, in one run.

N JSON records of an order (8 fields) decoded in fetch-sized batches
  (a) by ``JsonArrowDecoder`` alone (the baseline), and
  (b) by the same decoder behind a ``ContractGuard`` with a typical ODCS contract:
      2 required fields, 4 logical types, 2 bounds, a length and a pattern, a
      valid-values rule and a DataFusion SQL rule — with 1 % of the records breaking one
      rule (so the failure path with its per-row messages is paid too).
Prints rows/s and the ratio (b)/(a). Not a test: machines here are noisy.

    python load-tests/contract_bench.py --records 1000000
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import pyarrow as pa

from thalweg.codecs import JsonArrowDecoder
from thalweg.contracts import ContractGuard, SchemaObject, compile_object
from thalweg.records import MetadataColumns

CONTRACT = {
    "name": "orders",
    "properties": [
        {"name": "id", "logicalType": "integer", "required": True},
        {"name": "customer", "logicalType": "string", "required": True,
         "logicalTypeOptions": {"maxLength": 32, "pattern": "^customer-[0-9]+$"}},
        {"name": "qty", "logicalType": "integer",
         "logicalTypeOptions": {"minimum": 0, "maximum": 1000}},
        {"name": "price", "logicalType": "number"},
        {"name": "status", "quality": [{"metric": "invalidValues", "mustBe": 0,
                                        "arguments": {"validValues": ["new", "paid", "sent"]}}]},
    ],
    "quality": [{"name": "total", "type": "custom", "engine": "datafusion",
                 "implementation": "price * qty = total"}],
}  # fmt: skip


def payloads(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        qty = i % 9
        rec = {
            "id": i,
            "customer": f"customer-{i % 9973}",
            "qty": qty,
            "price": 2.5,
            "total": 2.5 * qty,
            "status": "new",
            "city": "Lisbon",
            "note": "x" * 40,
        }
        if i % 100 == 7:  # 1 %: one broken rule each, in turn
            rec["status" if i % 200 == 7 else "qty"] = "lost" if i % 200 == 7 else -1
        out.append(json.dumps(rec).encode())
    return out


def run(decoder: object, batches: list[pa.Array]) -> tuple[float, int]:
    started = time.perf_counter()
    failed = 0
    for values in batches:
        failed += len(decoder.decode(values).failures)  # type: ignore[attr-defined]
    return time.perf_counter() - started, failed


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000, help="records per fetched batch")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each, interleaved (best kept)")
    ap.add_argument("--no-sql", action="store_true", help="leave out the DataFusion SQL rule")
    args = ap.parse_args()
    print(
        f"{platform.python_implementation()} {platform.python_version()}, pyarrow {pa.__version__}"
    )
    data = payloads(args.records)
    batches = [
        pa.array(data[i : i + args.batch], pa.binary()) for i in range(0, len(data), args.batch)
    ]
    cols = MetadataColumns()
    obj = SchemaObject.model_validate(
        {**CONTRACT, "quality": [] if args.no_sql else CONTRACT["quality"]}
    )
    best: dict[str, tuple[float, int]] = {}
    for _ in range(args.repeats):
        for name, decoder in (
            ("plain", JsonArrowDecoder(cols)),
            ("contract", ContractGuard(JsonArrowDecoder(cols), compile_object(obj))),
        ):
            took, failed = run(decoder, batches)
            if name not in best or took < best[name][0]:
                best[name] = (took, failed)
    for name, (took, failed) in best.items():
        print(f"{name:9s} {took:6.2f}s  {args.records / took:12,.0f} rows/s  {failed:,} refused")
    print(f"ratio contract/plain {best['plain'][0] / best['contract'][0]:.2f}x")


if __name__ == "__main__":
    main()
