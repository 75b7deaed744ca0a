"""A put batch as produce columns: every envelope column converted without loss."""

from __future__ import annotations

import pyarrow as pa

from thalweg.config.models import KafkaSourceConfig
from thalweg.flight.put.plan import plan_put
from thalweg.records.model import Locator, RawRecord, Timestamp
from thalweg.records.rows import ProduceRows

SOURCE = KafkaSourceConfig(name="s", bootstrap_servers="127.0.0.1:1", topics=["t"], format="none")
HEADER = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def test_envelope_columns_become_rows() -> None:
    table = pa.table(
        {
            "value": pa.array(["a", None, ""], pa.string()),
            "key": pa.array([b"k", None, b""], pa.binary()),
            "headers": pa.array(
                [[{"key": "h", "value": b"1"}, {"key": "h", "value": None}], None, []], HEADER
            ),
            "partition": pa.array([2, None, 0], pa.int32()),
            "timestamp": pa.array([1_000, None, 0], pa.timestamp("ms", "UTC")),
        }
    )
    rows = plan_put("t", table.schema, SOURCE).rows(table.to_batches()[0])
    assert rows.values == [b"a", None, b""]
    assert rows.keys == [b"k", None, b""]
    assert rows.headers == [((b"h", b"1"), (b"h", None)), (), ()]
    assert rows.partitions == [2, -1, 0]
    assert rows.timestamps_ms[0] == 1_000 and rows.timestamps_ms[2] == 0
    assert rows.timestamps_ms[1] > 1_700_000_000_000  # null: the time of the put


def test_without_envelope_columns_and_with_a_null_key_column() -> None:
    table = pa.table({"value": pa.array([b"x", b"y"]), "key": pa.nulls(2)})
    rows = plan_put("t", table.schema, SOURCE).rows(table.to_batches()[0])
    assert rows.keys == [None, None] and rows.partitions == [-1, -1]
    assert rows.headers == [(), ()] and len(rows) == 2


def test_with_header_keeps_a_record_s_own_value() -> None:
    rows = ProduceRows(
        [None, None], [b"a", b"b"], [((b"traceparent", b"mine"),), ()], [1, 2], [-1, -1]
    )
    out = rows.with_header(b"traceparent", b"put")
    assert out.headers == [((b"traceparent", b"mine"),), ((b"traceparent", b"put"),)]
    assert rows.headers[1] == ()  # the original is untouched


def test_records_round_trip() -> None:
    records = [
        RawRecord(
            key=b"k",
            value=None,
            headers=((b"a", None),),
            timestamp=Timestamp(5),
            locator=Locator("c", "t", 3),
        )
    ]
    rows = ProduceRows.of(records)
    assert rows.records("c", "t") == records
