"""Record batches decoded into columns hold exactly what aiokafka's record reader sees."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import kafka_column_fields, kafka_record_fields
from thalweg.kafka.unpack import (
    BatchHeader,
    CorruptRecordError,
    check_crc,
    decode_records,
    records_section,
)

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int, int]

blobs = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(st.tuples(st.text(min_size=1, max_size=6), blobs), max_size=4)
records = st.lists(
    st.tuples(blobs, blobs, headers, st.integers(-(2**40), 2**41), st.integers(0, 3)),
    min_size=1,
    max_size=40,
).filter(lambda rs: any(k is not None or v is not None for k, v, *_ in rs))


def _batch(recs: list[Record], codec: int = 0, base: int = 1000) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 30)
    offset = 0
    for key, value, hs, ts, gap in recs:
        offset += gap  # a compacted batch: offset deltas with gaps
        builder.append(offset, ts, key, value, hs)
        offset += 1
    buf = builder.build()
    struct.pack_into(">q", buf, 0, base)
    return bytes(buf)


def _expected(buf: bytes) -> list[tuple[object, ...]]:
    return [kafka_record_fields(r) for r in DefaultRecordBatch(bytearray(buf))]


def _decoded(buf: bytes) -> list[tuple[object, ...]]:
    header = BatchHeader.parse(buf)
    assert check_crc(buf, header)
    return kafka_column_fields(decode_records(records_section(buf, header), header))


@settings(max_examples=120, deadline=None)
@given(records, st.sampled_from([0, 1, 2, 3, 4]))
def test_columns_equal_aiokafka_s_records(recs: list[Record], codec: int) -> None:
    buf = _batch(recs, codec)
    assert _decoded(buf) == _expected(buf)


def test_log_append_time_gives_every_record_the_broker_s_time() -> None:
    buf = bytearray(_batch([(b"k", b"v", [], 5, 0), (None, b"w", [], 9, 0)]))
    attributes = struct.unpack_from(">h", buf, 21)[0] | 0x08
    struct.pack_into(">h", buf, 21, attributes)
    struct.pack_into(">q", buf, 35, 777)  # maxTimestamp: what the broker wrote
    struct.pack_into(">I", buf, 17, calc_crc32c(memoryview(buf)[21:]))
    got = _decoded(bytes(buf))
    assert [(t, tt) for _, t, tt, *_ in got] == [(777, 1), (777, 1)]
    assert got == _expected(bytes(buf))


def test_large_values_and_many_headers() -> None:
    recs: list[Record] = [
        (b"k" * 20_000, b"v" * 300_000, [("h", b"x" * 5000)] * 3 + [("n", None)], 1, 0),
        (None, b"", [], 2, 0),
    ]
    buf = _batch(recs)
    assert _decoded(buf) == _expected(buf)


def test_a_record_whose_fields_overrun_its_length_is_corrupt() -> None:
    buf = _batch([(b"key", b"value", [], 1, 0), (b"k2", b"v2", [], 2, 0)])
    header = BatchHeader.parse(buf)
    data = bytearray(records_section(buf, header))
    data[data.index(b"key") - 1] = 8  # key length 3 -> 4: the value starts one byte late
    with pytest.raises(CorruptRecordError):
        decode_records(bytes(data), header)
    with pytest.raises(CorruptRecordError):
        decode_records(bytes(data[:-3]), header)  # truncated


def test_varint_decoding_at_many_positions() -> None:
    from aiokafka.record.util import encode_varint

    from thalweg.kafka.unpack import varints_at

    values = [0, 1, -1, 63, -64, 64, 8191, -8193, 2**31 - 1, -(2**31), 2**50, -(2**62)]
    raw = bytearray()
    at = []
    for v in values:
        at.append(len(raw))
        encode_varint(v, raw.append)
    buf = np.frombuffer(bytes(raw) + bytes(16), np.uint8)
    got, sizes = varints_at(buf, np.array(at), 10)
    assert got.tolist() == values
    assert (np.append(np.array(at[1:]), len(raw)) - np.array(at)).tolist() == sizes.tolist()
