"""A put batch as produce columns: every envelope column converted without loss."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from thalweg.config.models import KafkaSourceConfig
from thalweg.errors import TicketError
from thalweg.flight.put.plan import plan_put
from thalweg.records.model import Locator, RawRecord, Timestamp
from thalweg.records.rows import HEADER_TYPE, ProduceRows

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
    assert rows.values.to_pylist() == [b"a", None, b""]
    assert rows.keys.to_pylist() == [b"k", None, b""]
    assert rows.header_tuples() == [((b"h", b"1"), (b"h", None)), (), ()]
    assert rows.partitions.tolist() == [2, -1, 0]
    assert rows.timestamps_ms[0] == 1_000 and rows.timestamps_ms[2] == 0
    assert rows.timestamps_ms[1] > 1_700_000_000_000  # null: the time of the put


def test_header_fields_in_either_order_and_a_null_header_key_is_refused() -> None:
    flipped = pa.list_(pa.struct([("value", pa.string()), ("key", pa.binary())]))
    table = pa.table(
        {"value": [b"x"], "headers": pa.array([[{"value": "v", "key": b"k"}]], flipped)}
    )
    rows = plan_put("t", table.schema, SOURCE).rows(table.to_batches()[0])
    assert rows.header_tuples() == [((b"k", b"v"),)]
    bad = pa.table({"value": [b"x"], "headers": pa.array([[{"key": None, "value": b"v"}]], HEADER)})
    with pytest.raises(TicketError, match="header key is null"):
        plan_put("t", bad.schema, SOURCE).rows(bad.to_batches()[0])


def test_without_envelope_columns_and_with_a_null_key_column() -> None:
    table = pa.table({"value": pa.array([b"x", b"y"]), "key": pa.nulls(2)})
    rows = plan_put("t", table.schema, SOURCE).rows(table.to_batches()[0])
    assert rows.keys.to_pylist() == [None, None] and rows.partitions.tolist() == [-1, -1]
    assert rows.headers is None and rows.header_tuples() == [(), ()] and len(rows) == 2


def _rows(headers: list[list[dict[str, bytes | None]]] | None, n: int) -> ProduceRows:
    return ProduceRows(
        pa.nulls(n, pa.binary()),
        pa.array([b"v%d" % i for i in range(n)], pa.binary()),
        None if headers is None else pa.array(headers, HEADER_TYPE),
        np.arange(n, dtype=np.int64),
        np.full(n, -1, np.int64),
    )


def test_with_header_keeps_a_record_s_own_value_and_appends_last() -> None:
    rows = _rows(
        [
            [{"key": b"traceparent", "value": b"mine"}],
            [],
            [{"key": b"a", "value": None}, {"key": b"a", "value": b"2"}],
        ],
        3,
    )
    out = rows.with_header(b"traceparent", b"put")
    assert out.header_tuples() == [
        ((b"traceparent", b"mine"),),
        ((b"traceparent", b"put"),),
        ((b"a", None), (b"a", b"2"), (b"traceparent", b"put")),
    ]
    assert rows.header_tuples()[1] == ()  # the original is untouched
    sliced = rows.take(np.array([1, 2])).with_header(b"traceparent", b"put")
    assert sliced.header_tuples() == out.header_tuples()[1:]


def test_with_header_on_rows_without_headers() -> None:
    out = _rows(None, 2).with_header(b"t", b"x")
    assert out.header_tuples() == [((b"t", b"x"),), ((b"t", b"x"),)]


def test_take_keeps_every_column_in_the_order_asked() -> None:
    rows = _rows([[{"key": b"h", "value": b"%d" % i}] for i in range(5)], 5)
    for picked in (np.array([1, 2, 3]), np.array([4, 0, 2])):
        got = rows.take(picked)
        assert got.values.to_pylist() == [b"v%d" % i for i in picked]
        assert got.timestamps_ms.tolist() == picked.tolist()
        assert got.header_tuples() == [((b"h", b"%d" % i),) for i in picked]


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


def test_write_ahead_is_read_from_put_metadata_and_bounded() -> None:
    from thalweg.flight.errors import InvalidArgumentError
    from thalweg.flight.put.service import MAX_WRITE_AHEAD, _write_ahead

    assert _write_ahead(pa.py_buffer(b'{"write_ahead": 2}'), 0) == 2
    assert _write_ahead(pa.py_buffer(b'{"other": 1}'), 1) == 1  # not ours: unchanged
    for bad in (b"not json", b'{"write_ahead": -1}', b'{"write_ahead": true}'):
        with pytest.raises(InvalidArgumentError):
            _write_ahead(pa.py_buffer(bad), 0)
    too_many = b'{"write_ahead": %d}' % (MAX_WRITE_AHEAD + 1)
    with pytest.raises(InvalidArgumentError, match="write_ahead"):
        _write_ahead(pa.py_buffer(too_many), 0)
