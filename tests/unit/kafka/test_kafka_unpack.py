"""Record batches decoded into columns hold exactly what aiokafka's record reader sees."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import cast

import numpy as np
import pytest
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import kafka_column_fields, kafka_record_fields
from thalweg.kafka import unpack
from thalweg.kafka.columnar_fetch import (
    ColumnarFetch,
    _ColumnarPartitionRecords,
    _KeptMemoryRecords,
)
from thalweg.kafka.unpack import (
    BatchHeader,
    CorruptRecordError,
    KafkaColumns,
    check_crc,
    decode_batches,
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


@pytest.fixture(params=["numpy", "small"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a run of batches is read: the numpy pass and aiokafka's C reader."""
    monkeypatch.setattr(unpack, "SMALL_RUN", 0 if request.param == "numpy" else 1 << 30)
    return str(request.param)


def _run(batches: list[list[Record]], codec: int) -> list[bytes]:
    bufs, base = [], 0
    for i, recs in enumerate(batches):
        buf = bytearray(_batch(recs, codec, base=base))
        if i % 3 == 2:  # a LogAppendTime batch among CreateTime ones
            attributes = struct.unpack_from(">h", buf, 21)[0] | 0x08
            struct.pack_into(">h", buf, 21, attributes)
            struct.pack_into(">q", buf, 35, 10_000 + i)
            struct.pack_into(">I", buf, 17, calc_crc32c(memoryview(buf)[21:]))
        bufs.append(bytes(buf))
        base = BatchHeader.parse(buf).next_offset + 3  # a gap between batches
    return bufs


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(records, min_size=1, max_size=6), st.sampled_from([0, 2]))
def test_several_batches_decoded_at_once_equal_each_decoded_alone(
    reader: str, batches: list[list[Record]], codec: int
) -> None:
    """A fetch's small batches are decoded as one run; the rows are exactly what each
    batch gives on its own (offsets from each base, timestamps from each header)."""
    bufs = _run(batches, codec)
    expected = [row for b in bufs for row in _expected(b)]
    got = decode_batches([(b, BatchHeader.parse(b)) for b in bufs])
    assert kafka_column_fields(got) == expected


def test_a_header_key_that_is_not_utf8_keeps_its_bytes(reader: str) -> None:
    buf = _batch([(b"k", b"v", [], 1, 0)])
    # aiokafka's builder takes str keys; put raw bytes in by hand: same length, not UTF-8.
    raw = bytearray(_batch([(b"k", b"v", [("hh", b"x")], 1, 0)]))
    raw[raw.index(b"hh") : raw.index(b"hh") + 2] = b"\xff\xfe"
    struct.pack_into(">I", raw, 17, calc_crc32c(memoryview(raw)[21:]))
    got = kafka_column_fields(decode_batches([(bytes(raw), BatchHeader.parse(raw))]))
    assert got[0][5] == [(b"\xff\xfe", b"x")]
    assert _decoded(buf)[0][3:5] == (b"k", b"v")


def test_a_damaged_run_is_corrupt_either_way(reader: str) -> None:
    buf = bytearray(_batch([(b"key", b"value", [], 1, 0), (b"k2", b"v2", [], 2, 0)]))
    buf[buf.index(b"key") - 1] = 8  # key length 3 -> 4: the value starts one byte late
    with pytest.raises(CorruptRecordError):
        decode_batches([(bytes(buf), BatchHeader.parse(buf))])


def _fetch_response(data: bytes) -> Iterator[KafkaColumns]:
    """What the columnar fetcher hands over for a fetch response of ``data``."""
    marker = ColumnarFetch()
    marker.remaining = 1 << 30
    parts = _ColumnarPartitionRecords(
        TopicPartition("t", 0), _KeptMemoryRecords(data), [], 0, None, marker, True, 0
    )
    return cast(Iterator[KafkaColumns], parts._records_iterator)


def test_a_corrupt_batch_in_a_run_hands_over_the_batches_before_it() -> None:
    good = [_batch([(b"k", b"v%d" % i, [], i, 0)], base=i) for i in range(3)]
    bad = bytearray(_batch([(b"key", b"value", [], 9, 0)], base=3))
    bad[bad.index(b"key") - 1] = 8  # the key's length says 4: its fields overrun it
    struct.pack_into(">I", bad, 17, calc_crc32c(memoryview(bad)[21:]))  # CRC holds
    handed = _fetch_response(b"".join([*good, bytes(bad)]))
    seen = [int(o) for o in next(handed).offsets]
    seen += [int(o) for o in next(handed).offsets]
    seen += [int(o) for o in next(handed).offsets]
    assert seen == [0, 1, 2]
    with pytest.raises(CorruptRecordException, match="at offset 3"):
        next(handed)


def test_a_control_batch_between_record_batches_is_skipped() -> None:
    first = _batch([(b"a", b"1", [], 1, 0), (b"b", b"2", [], 2, 0)], base=0)
    marker = (b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [], 3, 0)
    control = bytearray(_batch([marker], base=2))
    attributes = struct.unpack_from(">h", control, 21)[0] | 0x20
    struct.pack_into(">h", control, 21, attributes)
    struct.pack_into(">I", control, 17, calc_crc32c(memoryview(control)[21:]))
    last = _batch([(b"c", b"3", [], 4, 0)], base=3)
    got = [
        row
        for cols in _fetch_response(b"".join([first, bytes(control), last]))
        for row in kafka_column_fields(cols)
    ]
    assert [r[0] for r in got] == [0, 1, 3]
    assert got == _expected(first) + _expected(last)
