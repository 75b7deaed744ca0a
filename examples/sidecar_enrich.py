"""A Thalweg sidecar in a few lines: tier each order by its amount.

Run it, then point a pipeline node at it (docs/sidecars.md):

    python examples/sidecar_enrich.py --listen grpc://127.0.0.1:9100

    [[pipeline.nodes]]
    name = "orders_tiered"
    from = "orders"
    sidecar = "grpc://127.0.0.1:9100"
    command = "tier"
    sink = "lake"

The locator columns come in with every batch and go back out untouched: appending a
column keeps each row tied to its record. A batch holding an order with a negative
amount is refused with an error: the gateway retries it, then finds the refused orders
and writes them to the node's dead-letter lane (reason ``transform``); the rest go on.
"""

from __future__ import annotations

import argparse

import pyarrow as pa
import pyarrow.compute as pc

from thalweg_client.sidecar import Sidecar


class Enrich(Sidecar):
    def transform(self, command: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        if command != "tier":
            raise ValueError(f"unknown command {command!r}; this sidecar offers 'tier'")
        amount = pc.cast(batch.column("amount"), pa.float64())
        if pc.any(pc.less(amount, 0)).as_py():
            raise ValueError("an order's amount cannot be negative")
        tier = pc.if_else(pc.greater(amount, 100), "gold", "basic")
        return batch.append_column("tier", tier)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="grpc://127.0.0.1:9100")
    ap.add_argument("--token", default=None, help="require this bearer token")
    args = ap.parse_args()
    server = Enrich(args.listen, token=args.token)
    print(f"sidecar listening on port {server.port}", flush=True)
    server.serve()


if __name__ == "__main__":
    main()
