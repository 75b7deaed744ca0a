"""Record batches built from Arrow columns are byte for byte what aiokafka writes."""

from __future__ import annotations

import asyncio

import numpy as np
import pyarrow as pa
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.record.default_records import (
    DefaultRecordBatch,
    _DefaultRecordBatchBuilderPy,
)
from aiokafka.record.util import encode_varint
from hypothesis import given, settings
from hypothesis import strategies as st

from thalweg.kafka import wire
from thalweg.kafka.producer import KafkaWriter
from thalweg.records.rows import HEADER_TYPE, ProduceRows

LIMIT = 4096

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]

blobs = st.one_of(st.none(), st.binary(max_size=600))
headers = st.lists(st.tuples(st.text(min_size=1, max_size=8), blobs), max_size=3)
records = st.lists(
    st.tuples(blobs, blobs, headers, st.integers(-(2**40), 2**41)), min_size=1, max_size=60
)


def _columns(recs: list[Record]) -> ProduceRows:
    with_headers = any(h for _, _, h, _ in recs)
    return ProduceRows(
        pa.array([k for k, _, _, _ in recs], pa.binary()),
        pa.array([v for _, v, _, _ in recs], pa.binary()),
        pa.array(
            [[{"key": a.encode(), "value": b} for a, b in h] for _, _, h, _ in recs], HEADER_TYPE
        )
        if with_headers
        else None,
        np.array([t for _, _, _, t in recs], np.int64),
        np.full(len(recs), -1, np.int64),
    )


def _aiokafka(recs: list[Record], codec: int = 0) -> bytes:
    """The same records through aiokafka's own (pure Python) batch builder."""
    builder = _DefaultRecordBatchBuilderPy(2, codec, 0, -1, -1, -1, 1 << 30)
    for i, (key, value, hs, ts) in enumerate(recs):
        builder.append(i, ts, key, value, hs)
    return bytes(builder.build())


@settings(max_examples=150, deadline=None)
@given(records)
def test_batches_are_what_aiokafka_builds(recs: list[Record]) -> None:
    covered = 0
    for start, stop, batch in wire.batches(_columns(recs), LIMIT):
        assert start == covered and stop > start
        covered = stop
        built = bytes(batch._build())
        assert len(built) <= LIMIT or stop - start == 1  # an oversized record goes alone
        assert built == _aiokafka(recs[start:stop])
        parsed = list(DefaultRecordBatch(bytearray(built)))
        assert [(r.key, r.value) for r in parsed] == [(k, v) for k, v, _, _ in recs[start:stop]]
    assert covered == len(recs)


@settings(max_examples=40, deadline=None)
@given(records, st.sampled_from(["gzip", "snappy", "lz4", "zstd"]))
def test_compressed_batches_are_what_aiokafka_builds(recs: list[Record], codec: str) -> None:
    """With a codec, a batch's records are compressed (and sent plain when they do not
    shrink, as aiokafka does). snappy and zstd are byte for byte aiokafka's batches; gzip
    carries a clock and gzip and lz4 use faster levels than aiokafka, so those are
    compared by what they hold."""
    number = wire.CODECS[codec][0]
    for start, stop, batch in wire.batches(_columns(recs), LIMIT, codec):
        built = bytes(batch._build())
        parsed = DefaultRecordBatch(bytearray(built))
        assert parsed.validate_crc()
        assert parsed.compression_type in (0, number)
        expected = recs[start:stop]
        assert [(r.key, r.value, r.timestamp) for r in parsed] == [
            (k, v, t) for k, v, _, t in expected
        ]
        if codec in ("snappy", "zstd"):
            assert built == _aiokafka(expected, number)


def test_a_batch_that_shrinks_is_sent_compressed() -> None:
    cols = _columns([(None, b"the same value " * 20, [], i) for i in range(200)])
    ((_, _, batch),) = wire.batches(cols, 1 << 20, "zstd")
    built = batch._build()
    plain = next(iter(wire.batches(cols, 1 << 20)))[2]._build()
    assert DefaultRecordBatch(bytearray(built)).compression_type == wire.CODECS["zstd"][0]
    assert len(built) < len(plain) / 10


def test_varints_match_kafka_s_encoding() -> None:
    values = [0, 1, -1, 63, 64, -64, -65, 8191, 8192, 2**31 - 1, -(2**31), 2**62, -(2**63)]
    got = wire.varints(np.array(values, np.int64)).to_pylist()
    for v, enc in zip(values, got, strict=True):
        out = bytearray()
        encode_varint(v, out.append)
        assert enc == bytes(out), v


def test_split_keeps_runs_under_the_limit_and_sends_a_large_record_alone() -> None:
    assert wire.split(np.array([10, 10, 10, 10]), 25) == [(0, 2), (2, 4)]
    assert wire.split(np.array([10, 100, 10]), 25) == [(0, 1), (1, 2), (2, 3)]
    assert wire.split(np.array([], np.int64), 25) == []


def test_producer_state_is_written_into_the_header() -> None:
    cols = _columns([(b"k", b"v", [], 5), (None, None, [], 6)])
    ((_, _, batch),) = wire.batches(cols, LIMIT)
    batch._set_producer_state(42, 3, 17)
    parsed = DefaultRecordBatch(bytearray(batch._build()))
    assert (parsed.producer_id, parsed.producer_epoch, parsed.base_sequence) == (42, 3, 17)
    assert parsed.validate_crc()
    assert [(r.key, r.value) for r in parsed] == [(b"k", b"v"), (None, None)]


def test_keyed_rows_go_where_aiokafka_s_partitioner_sends_them() -> None:
    keys = [b"a", b"b", b"customer-1", b"a", None, None, None]

    async def targets() -> np.ndarray:
        writer = KafkaWriter("127.0.0.1:1", keep_partition=False)
        rows = _columns([(k, b"v", [], 0) for k in keys])
        return writer._targets(rows, [0, 1, 2, 3, 4])

    got = asyncio.run(targets())
    partitioner = DefaultPartitioner()
    for key, p in zip(keys[:4], got[:4], strict=True):
        assert p == partitioner(key, [0, 1, 2, 3, 4], [0, 1, 2, 3, 4])
    keyless = got[4:].tolist()
    assert len(set(keyless)) == 3  # three keyless rows over five partitions: one run each
