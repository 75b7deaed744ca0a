"""Read a topic into Spark, spreading the gateway's endpoints over executors.

The driver asks the gateway for the read's endpoints (one per partition, or per slice of
a large history); each becomes one row of a small DataFrame, one Spark partition per
row, and ``mapInArrow`` has every executor fetch its endpoints with ``do_get`` and hand
the Arrow batches straight to Spark — no pandas, no row-by-row conversion.

Columns Spark's Arrow bridge cannot take are widened first: fixed-size binary (the
record id) becomes binary, timestamps and durations become microseconds (Spark's unit),
unsigned integers become the next signed width.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from thalweg_client.client import connect


def spark_safe_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with types Spark cannot read from Arrow replaced by ones it can."""
    return pa.schema([pa.field(f.name, _safe(f.type), f.nullable) for f in schema])


def _safe(t: pa.DataType) -> pa.DataType:
    if pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=t.tz)  # Spark's only timestamp unit
    if pa.types.is_duration(t):
        return pa.duration("us")
    if pa.types.is_uint8(t) or pa.types.is_uint16(t):
        return pa.int32() if pa.types.is_uint16(t) else pa.int16()
    if pa.types.is_uint32(t) or pa.types.is_uint64(t):
        return pa.int64()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _safe(f.type), f.nullable) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(pa.field(t.value_field.name, _safe(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(_safe(t.key_type), _safe(t.item_type))
    return t


def read_topic(spark: Any, location: str, topic: str, **options: Any) -> Any:
    """A Spark DataFrame of one bounded read of ``topic``.

    Args:
        spark: the ``SparkSession``.
        location: the gateway, as for :func:`thalweg_client.connect`.
        topic: the topic to read; ``options`` are the read's ticket fields (``lane``,
            ``start``, ``end``, ``columns``, ``filter``...) plus ``token`` and TLS
            settings for :func:`~thalweg_client.connect`.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    conn_keys = {"token", "tls_root_certs", "cert_chain", "private_key", "ticket_encoding"}
    conn = {k: options.pop(k) for k in list(options) if k in conn_keys}
    if options.get("end") == "follow":
        raise ValueError("read_topic needs a bounded end; Spark reads are batch reads")
    with connect(location, **conn) as client:
        info = client.endpoints(topic, **options)
        headers = client.call_headers
    schema = spark_safe_schema(info.schema)
    rows = [
        (e.ticket.ticket, [loc.uri.decode() for loc in e.locations] or [location])
        for e in info.endpoints
    ]
    spark_schema = from_arrow_schema(schema)
    tls = {k: v for k, v in conn.items() if k in ("tls_root_certs", "cert_chain", "private_key")}

    def fetch(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for ticket_bytes, locations in zip(
                batch.column("ticket").to_pylist(),
                batch.column("locations").to_pylist(),
                strict=True,
            ):
                client = fl.FlightClient(locations[0], **tls)
                try:
                    call = fl.FlightCallOptions(headers=headers)
                    reader = client.do_get(fl.Ticket(ticket_bytes), options=call)
                    for chunk in reader:
                        data = chunk.data
                        yield data if data.schema == schema else data.cast(schema)
                finally:
                    client.close()

    if not rows:
        return spark.createDataFrame([], spark_schema)
    plan = spark.createDataFrame(rows, "ticket binary, locations array<string>")
    return plan.repartition(len(rows)).mapInArrow(fetch, spark_schema)
