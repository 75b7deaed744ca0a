"""Decode benchmark: Thalweg's decoders against naive per-record baselines, in one run.

Avro: 1,000,000 Confluent-framed records of a 10-field schema (ints, longs, doubles,
strings, a nullable union, a timestamp, a decimal) decoded to one Arrow table
  (a) naively: fastavro.schemaless_reader per record + pa.Table.from_pylist
  (b) by thalweg's AvroArrowDecoder (native container-file path).
JSON: the same records as JSON objects, (a) json.loads + from_pylist vs (b) JsonArrowDecoder.
Debezium: the same rows as update events (``before``, ``after``, ``op``, ``source``, ``ts_ms``;
one in ten a delete), (a) json.loads, the row image picked, + from_pylist vs (b)
``DebeziumEnvelope`` over the JSON decoder (``envelope = "debezium"``); beside it the
envelope's cost: (b) against the plain JSON decoder on the bare rows.

    python load-tests/decode_bench.py --records 1000000
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import io
import json
import platform
import struct
import time

import fastavro
import pyarrow as pa

from thalweg.codecs import JsonArrowDecoder
from thalweg.codecs.avro import AvroArrowDecoder, StaticSchemas
from thalweg.codecs.envelope import DebeziumEnvelope
from thalweg.records import MetadataColumns

SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "int"},
        {"name": "sku", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "tax", "type": "double"},
        {"name": "customer", "type": "string"},
        {"name": "city", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        },
    ],
}
T0 = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)


def record(i: int) -> dict[str, object]:
    return {
        "id": i,
        "qty": i % 9,
        "sku": i % 5000,
        "price": i * 0.25,
        "tax": 0.2,
        "customer": f"customer-{i % 9973}",
        "city": "Lisbon",
        "note": None if i % 4 else "gift",
        "ts": T0 + dt.timedelta(milliseconds=i),
        "amount": decimal.Decimal(i % 100000) / 100,
    }


def best_of(fn, repeat: int = 2) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1_000_000)
    n = ap.parse_args().records
    parsed = fastavro.parse_schema(SCHEMA)
    avro, js = [], []
    for i in range(n):
        buf = io.BytesIO()
        rec = record(i)
        fastavro.schemaless_writer(buf, parsed, rec)
        avro.append(b"\x00" + struct.pack(">I", 1) + buf.getvalue())
        js.append(
            json.dumps({**rec, "ts": rec["ts"].isoformat(), "amount": str(rec["amount"])}).encode()
        )
    avro_arr, js_arr = pa.array(avro, pa.binary()), pa.array(js, pa.binary())
    events = []
    for i, v in enumerate(js):
        row = json.loads(v)
        gone = i % 10 == 9
        body = {"before": row, "after": None if gone else {**row, "qty": 1}, "op": "du"[not gone]}
        body |= {"source": {"connector": "postgresql", "lsn": i}, "ts_ms": 1_764_000_000_000}
        events.append(json.dumps(body).encode())
    ev_arr = pa.array(events, pa.binary())
    cols = MetadataColumns()

    def naive_avro() -> pa.Table:
        return pa.Table.from_pylist(
            [fastavro.schemaless_reader(io.BytesIO(p[5:]), parsed) for p in avro]
        )

    def thalweg_avro() -> pa.Table:
        result = AvroArrowDecoder(cols, StaticSchemas({1: SCHEMA})).decode(avro_arr)
        assert not result.failures
        return result.table

    def naive_json() -> pa.Table:
        return pa.Table.from_pylist([json.loads(v) for v in js])

    def thalweg_json() -> pa.Table:
        result = JsonArrowDecoder(cols).decode(js_arr)
        assert not result.failures
        return result.table

    def naive_debezium() -> pa.Table:
        rows = []
        for v in events:
            e = json.loads(v)
            image = e["after"] if e["op"] != "d" else e["before"]
            rows.append({**image, "__op": e["op"], "__deleted": e["op"] == "d"})
        return pa.Table.from_pylist(rows)

    def thalweg_debezium() -> pa.Table:
        result = DebeziumEnvelope(JsonArrowDecoder(cols)).decode(ev_arr)
        assert not result.failures
        return result.table

    print(f"machine: {platform.machine()}, Python {platform.python_version()}, {n:,} records")
    for name, naive, ours in (
        ("avro", naive_avro, thalweg_avro),
        ("json", naive_json, thalweg_json),
        ("debezium", naive_debezium, thalweg_debezium),
        ("envelope cost", thalweg_json, thalweg_debezium),
    ):
        a, b = best_of(naive), best_of(ours)
        print(
            f"{name}: naive {n / a:10,.0f} rows/s   thalweg {n / b:10,.0f} rows/s   "
            f"ratio {a / b:.1f}x"
        )


if __name__ == "__main__":
    main()
