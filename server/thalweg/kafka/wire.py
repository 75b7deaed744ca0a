"""Kafka record batches (magic 2) built from Arrow columns in bulk.

A producer's per-record ``append`` — varints, key, value and headers written one record
at a time in Python — was most of ``do_put``'s cost (about 5 µs a record with the
partitioner and our loop around it). Every field of a record batch is either a fixed
header or a per-record concatenation of varints and bytes, so the whole batch can be
built with Arrow kernels instead: varints are computed for all records at once with
numpy, the pieces of every record are joined by ``binary_join_element_wise``, and the
batch body is the data buffer of the result. Python runs once per batch, not per record.

The bytes are exactly what aiokafka's own builder writes for the same records (a unit
test compares them; compressed, too, except that gzip and lz4 use librdkafka's faster
levels), and :class:`PrebuiltBatch` hands them to aiokafka's ``send_batch`` so its
sender, retries and idempotent-producer sequencing are unchanged. A batch is compressed
on a worker thread before it is handed over (``KafkaWriter``), not on the event loop as
aiokafka's own batches are; the sender compresses one that was not.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from aiokafka.codec import gzip_encode, lz4_encode, snappy_encode, zstd_encode
from aiokafka.record.util import calc_crc32c

from thalweg.errors import InvariantError
from thalweg.records.rows import ProduceRows

#: The record batch header (see Kafka's DefaultRecordBatch): base offset, length,
#: partition leader epoch, magic, CRC, attributes, last offset delta, first and max
#: timestamp, producer id, producer epoch, base sequence, record count.
HEADER = struct.Struct(">qiibIhiqqqhii")
_CRC_AT = struct.calcsize(">qiib")
_ATTRIBUTES_AT = struct.calcsize(">qiibI")
_AFTER_LENGTH = struct.calcsize(">qi")
#: The most a record adds to its key, value and headers: a length varint (5), the
#: attributes byte, a timestamp-delta varlong (10) and an offset-delta varint (5).
RECORD_OVERHEAD = 21
#: Record-batch codecs by name: the attributes' codec bits and aiokafka's encoder, at
#: librdkafka's producer levels rather than aiokafka's: over a 1 MiB batch of JSON here,
#: lz4 at 9 took 17.8 ms against 1.6 ms at its fast level (8 % larger), gzip at 9
#: 37 ms against 12 ms at 6 (0.6 % larger). zstd stays at 3, Kafka's default.
CODECS: dict[str, tuple[int, Callable[[bytes], bytes]]] = {
    "gzip": (1, partial(gzip_encode, compresslevel=6)),
    "snappy": (2, snappy_encode),
    "lz4": (3, partial(lz4_encode, level=0)),
    "zstd": (4, partial(zstd_encode, level=3)),
}


def varints(values: np.ndarray) -> pa.BinaryArray:
    """Each value as a zigzag varint (Kafka's ``Varint``/``Varlong``), one binary value
    per input value."""
    v = values.astype(np.int64, copy=False)
    z = ((v << 1) ^ (v >> 63)).view(np.uint64)
    sizes = np.ones(len(z), np.int64)
    rest = z >> np.uint64(7)
    while rest.any():
        sizes += rest != 0
        rest >>= np.uint64(7)
    width = int(sizes.max()) if len(z) else 1
    place = np.arange(width)
    groups = ((z[:, None] >> (place * 7).astype(np.uint64)) & np.uint64(0x7F)).astype(np.uint8)
    groups |= np.where(place[None, :] < (sizes[:, None] - 1), np.uint8(0x80), np.uint8(0))
    data = groups[place[None, :] < sizes[:, None]]
    offsets = np.zeros(len(z) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    out: pa.BinaryArray = pa.Array.from_buffers(
        pa.binary(), len(z), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    return out


def _lengths(col: pa.Array) -> np.ndarray:
    """Byte length of each value, -1 for null (Kafka's null ``Bytes``)."""
    lengths: np.ndarray = pc.fill_null(pc.binary_length(col), -1).to_numpy(zero_copy_only=False)
    return lengths


def _sized(col: pa.Array) -> tuple[pa.Array, pa.Array]:
    """A nullable bytes field as (length varint, bytes with null as empty)."""
    return varints(_lengths(col)), pc.fill_null(col, b"")


def _sizes(col: pa.Array) -> np.ndarray:
    """Byte length of each (non-null) binary value, as int64."""
    sizes: np.ndarray = pc.binary_length(col).to_numpy(zero_copy_only=False)
    return sizes.astype(np.int64, copy=False)


def _data(col: pa.Array) -> pa.Buffer:
    """The bytes of every value of a binary array, back to back (its data buffer, cut to
    the values the array covers)."""
    _, offsets, data = col.buffers()
    if offsets is None:
        raise InvariantError("offsets is not set")
    if data is None:
        raise InvariantError("data is not set")
    bounds = np.frombuffer(offsets, np.int32)[col.offset : col.offset + len(col) + 1]
    return data[int(bounds[0]) : int(bounds[-1])]


def _join(*parts: pa.Array | bytes) -> pa.BinaryArray:
    joined: pa.BinaryArray = pc.binary_join_element_wise(*parts, b"")
    return joined


def header_bytes(headers: pa.ListArray) -> pa.BinaryArray:
    """Per record: the header count varint and every header (key, value) as Kafka writes
    them. ``headers`` is :data:`~thalweg.records.rows.HEADER_TYPE` with no null list and
    no null key (:class:`ProduceRows` holds them so)."""
    offsets = np.asarray(headers.offsets, dtype=np.int64)
    first = int(offsets[0])
    entries = headers.values.slice(first, int(offsets[-1]) - first)  # this slice's only
    key_len, key = _sized(pc.struct_field(entries, "key"))
    value_len, value = _sized(pc.struct_field(entries, "value"))
    joined = _join(key_len, key, value_len, value)
    per_record = pa.ListArray.from_arrays(pa.array((offsets - first).astype(np.int32)), joined)
    body = pc.binary_join(per_record, b"")
    count = varints(pc.list_value_length(headers).to_numpy(zero_copy_only=False))
    return _join(count, body)


def record_tails(records: ProduceRows) -> pa.BinaryArray:
    """Per record everything after the offset delta: key, value and headers."""
    key_len, key = _sized(records.keys)
    value_len, value = _sized(records.values)
    if records.headers is None:
        return _join(key_len, key, value_len, value, b"\x00")
    return _join(key_len, key, value_len, value, header_bytes(records.headers))


def split(sizes: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """[start, stop) runs of records whose sizes (upper bounds, header included) fit
    ``limit`` bytes; a record larger than ``limit`` goes alone, as a producer sends it."""
    cumulative = np.cumsum(sizes)
    runs = []
    start, base, n = 0, 0, len(sizes)
    while start < n:
        stop = int(np.searchsorted(cumulative, base + limit, side="right"))
        stop = max(stop, start + 1)
        runs.append((start, stop))
        base = int(cumulative[stop - 1])
        start = stop
    return runs


class PrebuiltBatch:
    """A record batch whose records are already encoded, in the shape aiokafka's
    ``send_batch`` takes (its ``BatchBuilder``); the header — producer state included —
    is written when the sender builds it.

    ``compress`` may be called first on a worker thread (``KafkaWriter.enqueue`` does):
    a gzip batch costs 12 ms per MiB, and the codecs release the GIL, so the event loop
    meanwhile sends the batch before. Otherwise the sender compresses when it builds.
    """

    def __init__(
        self,
        records: bytes | pa.Buffer,
        count: int,
        first_ms: int,
        max_ms: int,
        compression: str = "none",
    ):
        self._attributes = 0  # no compression, create time, not transactional
        self._compression = compression
        self._records = records
        self._count = count
        self._first_ms = first_ms
        self._max_ms = max_ms
        self._producer = (-1, -1, -1)
        self._buffer: bytearray | None = None

    def _set_producer_state(
        self, producer_id: int, producer_epoch: int, base_sequence: int
    ) -> None:
        self._producer = (producer_id, producer_epoch, base_sequence)

    def compress(self) -> None:
        """Compress the records with the batch's codec (once; a no-op for "none")."""
        if self._compression == "none":
            return
        codec, encode = CODECS[self._compression]
        self._compression = "none"
        records = self._records
        plain = records if isinstance(records, bytes) else records.to_pybytes()
        packed = encode(plain)  # bytes: aiokafka's lz4 takes nothing else
        if len(packed) < len(records):  # as aiokafka: else sent as it is
            self._records, self._attributes = packed, codec

    def _build(self) -> bytearray:
        if self._buffer is None:
            self.compress()
            records, attributes = self._records, self._attributes
            buf = bytearray(HEADER.size + len(records))
            buf[HEADER.size :] = memoryview(records)
            producer_id, epoch, sequence = self._producer
            HEADER.pack_into(
                buf,
                0,
                0,  # base offset: the broker's
                len(buf) - _AFTER_LENGTH,
                -1,  # partition leader epoch
                2,  # magic
                0,  # CRC, below
                attributes,
                self._count - 1,
                self._first_ms,
                self._max_ms,
                producer_id,
                epoch,
                sequence,
                self._count,
            )
            struct.pack_into(">I", buf, _CRC_AT, calc_crc32c(memoryview(buf)[_ATTRIBUTES_AT:]))
            self._buffer = buf
            self._records = b""
        return self._buffer

    def size(self) -> int:
        return len(self._buffer) if self._buffer is not None else HEADER.size + len(self._records)

    def record_count(self) -> int:
        return self._count

    def closed(self) -> bool:
        return True  # complete: the sender may take it at once

    def close(self) -> None:
        return None


def batches(
    records: ProduceRows, limit: int, compression: str = "none"
) -> Iterator[tuple[int, int, PrebuiltBatch]]:
    """The records as (start, stop, batch) of at most ``limit`` bytes each before
    compression, in order; ``compression`` names a codec of :data:`CODECS` or "none"."""
    n = len(records)
    if not n:
        return
    tails = record_tails(records)
    tail_sizes = _sizes(tails)
    for start, stop in split(tail_sizes + RECORD_OVERHEAD, limit - HEADER.size):
        stamps = records.timestamps_ms[start:stop]
        first = int(stamps[0])
        delta = varints(stamps - first)
        offset_delta = varints(np.arange(stop - start))
        tail = tails[start:stop]
        body_sizes = 1 + _sizes(delta) + _sizes(offset_delta) + tail_sizes[start:stop]
        joined = _join(varints(body_sizes), b"\x00", delta, offset_delta, tail)
        yield (
            start,
            stop,
            PrebuiltBatch(_data(joined), stop - start, first, int(stamps.max()), compression),
        )
