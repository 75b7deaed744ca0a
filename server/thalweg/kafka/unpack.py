"""Kafka record batches (magic 2) decoded straight into Arrow columns.

aiokafka turns every fetched record into two Python objects (its own record, then a
``ConsumerRecord``), about 2 to 3 µs a record here, and the raw lane then reads every
field back out of them. That per-record work was the floor of ingest. This module reads
a batch's bytes instead: one short Python loop finds where each record starts (a record
begins with its length), and every field of every record is then decoded at once with
numpy — varints by gathering up to ten bytes per record, keys, values and header fields
as Arrow binary views into the batch's own buffer, made contiguous by one Arrow cast.

Everything a record carries is kept exactly: null keys and values, empty ones, headers
in order with duplicate keys and null values, the batch's timestamp type (a
LogAppendTime batch gives every record the broker's time, as Kafka's clients do), and
offsets from the batch's base plus each record's own delta (compacted batches have
gaps). A record that does not end where its length says it does is a
:class:`CorruptRecordError`, never a silently shifted row.

Its length: the wire format's parsing, the numpy batch path and aiokafka's C reader
for small runs must decode alike; they are kept side by side on purpose.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from aiokafka.codec import gzip_decode, lz4_decode, snappy_decode, zstd_decode
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.record.util import calc_crc32c

from thalweg.errors import ThalwegError
from thalweg.records.columns import HEADER_TYPE
from thalweg.records.raw_batch import build_headers

#: baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
#: firstTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, records count.
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
LOG_OVERHEAD = 12  # baseOffset + batchLength: what the length does not count
MAGIC_AT = 16
_CRC_FROM = 21  # the CRC covers attributes to the end
_CODECS = {1: gzip_decode, 2: snappy_decode, 3: lz4_decode, 4: zstd_decode}
_PAD = 16  # zero bytes after a batch so every gather of up to ten bytes stays inside
_HEADER_STRUCT = HEADER_TYPE.value_type


class CorruptRecordError(ThalwegError):
    """A record batch whose bytes do not parse (its CRC held: a broker or producer bug)."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    length: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    count: int

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & 0x20)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & 0x10)

    @property
    def timestamp_type(self) -> int:
        return (self.attributes >> 3) & 1

    @classmethod
    def parse(cls, buf: bytes | memoryview) -> BatchHeader:
        f = BATCH_HEADER.unpack_from(buf)
        return cls(f[0], f[1], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[12])


@dataclass(frozen=True, slots=True)
class KafkaColumns:
    """Fetched records of one partition as columns, in offset order."""

    offsets: np.ndarray  # int64
    timestamps: np.ndarray  # int64, epoch ms
    timestamp_types: np.ndarray  # int8: 0 CreateTime, 1 LogAppendTime
    keys: pa.Array  # binary
    values: pa.Array  # binary
    headers: pa.Array  # HEADER_TYPE

    def __len__(self) -> int:
        return len(self.offsets)

    def since(self, offset: int) -> KafkaColumns:
        """The records at ``offset`` or after (a compressed batch may start earlier)."""
        skip = int(np.searchsorted(self.offsets, offset, side="left"))
        return self if skip == 0 else self.drop(skip)

    def head(self, n: int) -> KafkaColumns:
        """The first ``n`` records."""
        return self._rows(0, n)

    def drop(self, n: int) -> KafkaColumns:
        """All but the first ``n`` records."""
        return self._rows(n, len(self))

    def _rows(self, start: int, stop: int) -> KafkaColumns:
        n = stop - start
        return KafkaColumns(
            self.offsets[start:stop],
            self.timestamps[start:stop],
            self.timestamp_types[start:stop],
            self.keys.slice(start, n),
            self.values.slice(start, n),
            self.headers.slice(start, n),
        )

    @staticmethod
    def concat(parts: list[KafkaColumns]) -> KafkaColumns:
        if len(parts) == 1:
            return parts[0]
        return KafkaColumns(
            np.concatenate([p.offsets for p in parts]),
            np.concatenate([p.timestamps for p in parts]),
            np.concatenate([p.timestamp_types for p in parts]),
            pa.concat_arrays([p.keys for p in parts]),
            pa.concat_arrays([p.values for p in parts]),
            pa.concat_arrays([p.headers for p in parts]),
        )


def check_crc(batch: bytes | memoryview, header: BatchHeader) -> bool:
    """Whether the batch's CRC-32C (attributes to the end) is the one it carries."""
    return int(calc_crc32c(memoryview(batch)[_CRC_FROM:])) == header.crc


def records_section(batch: bytes | memoryview, header: BatchHeader) -> bytes | memoryview:
    """The records of a batch, decompressed (uncompressed: a view, not a copy)."""
    body = memoryview(batch)[BATCH_HEADER.size :]
    codec = header.attributes & 0x07
    if codec == 0:
        return body
    decode = _CODECS.get(codec)
    if decode is None:
        raise CorruptRecordError(f"unknown compression codec {codec} in a record batch")
    return bytes(decode(body.tobytes()))


def record_starts(data: bytes, count: int) -> np.ndarray:
    """Where each of ``count`` records starts: each begins with its length (a zigzag
    varint), so this is one step per record — the only per-record Python there is."""
    starts: list[int] = []
    _walk_records(data, 0, len(data), count, starts)
    return np.array(starts, np.int64)


def _walk_records(data: bytes, pos: int, end: int, count: int, starts: list[int]) -> None:
    """Append the starts of the ``count`` records of ``data[pos:end]`` to ``starts``;
    they must fill that span exactly."""
    for i in range(count):
        if pos >= end:
            raise CorruptRecordError(f"a record batch ends after {i} of its {count} records")
        starts.append(pos)
        b = data[pos]
        if b < 0x80:
            pos += 1 + (b >> 1)
            continue
        c = data[pos + 1] if pos + 1 < end else 0
        if c < 0x80:
            pos += 2 + (((b & 0x7F) | (c << 7)) >> 1)
            continue
        z, shift, size = 0, 0, 0
        while True:
            if pos + size >= end or size >= 5:
                raise CorruptRecordError("a record length varint runs past its batch")
            byte = data[pos + size]
            z |= (byte & 0x7F) << shift
            shift += 7
            size += 1
            if byte < 0x80:
                break
        pos += size + (z >> 1)
    if pos != end:
        raise CorruptRecordError(
            f"a record batch has {end - pos} bytes after its {count} records"
            if pos < end
            else "the last record of a batch runs past its end"
        )


def varints_at(buf: np.ndarray, at: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varints starting at each position: (values, sizes in bytes).

    One gather per byte position, for the records whose varint is still going: most
    fields are one or two bytes, so this is two or three numpy passes.
    """
    b = buf[at]
    z = (b & 0x7F).astype(np.uint64)
    sizes = np.ones(len(at), np.int64)
    going = np.flatnonzero(b >= 0x80)
    k = 1
    while len(going):
        if k >= width:
            raise CorruptRecordError(f"a varint longer than {width} bytes")
        b = buf[at[going] + k]
        z[going] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        sizes[going] += 1
        going = going[b >= 0x80]
        k += 1
    values = (z >> np.uint64(1)).astype(np.int64) ^ -(z & np.uint64(1)).astype(np.int64)
    return values, sizes


def binary_at(data: pa.Buffer, buf: np.ndarray, at: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """Binary values ``buf[at[i] : at[i] + lengths[i]]`` (length -1: null), as views into
    ``data`` (Arrow's binary view layout: 16 bytes a value, up to 12 inline) made
    contiguous by one cast."""
    n = len(at)
    nulls = lengths < 0
    null_count = int(nulls.sum())
    if null_count == n:
        return pa.nulls(n, pa.binary())
    size = np.maximum(lengths, 0).astype(np.int32)
    views = np.zeros((n, 4), np.int32)
    views[:, 0] = size
    long = size > 12
    if long.any():
        start = at[long]
        views[long, 1] = buf[start[:, None] + np.arange(4)].view(np.int32).ravel()
        views[long, 3] = start  # buffer 0, offset: the value stays where it is
    short = np.flatnonzero((size > 0) & ~long)
    if len(short):
        grab = buf[at[short][:, None] + np.arange(12)]
        grab *= np.arange(12)[None, :] < size[short, None]
        views[short, 1:4] = grab.view(np.int32)
    validity = None
    if null_count:
        validity = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    out = pa.Array.from_buffers(
        pa.binary_view(), n, [validity, pa.py_buffer(views), data], null_count=null_count
    )
    return out.cast(pa.binary())


def decode_records(data: bytes | memoryview, header: BatchHeader) -> KafkaColumns:
    """The records of one (decompressed) batch as columns, in one numpy pass."""
    return _decode_sections([(data, header)])


#: Runs of at most this many records are read by aiokafka's C record reader: the numpy
#: pass has a fixed cost of about 300 µs (some forty numpy calls) that the C reader's
#: ~1-3 µs a record only passes at 500-1,000 records (measured here, with and without
#: headers). Small runs are what a producer that lingers little sends, and most fetches
#: of a topic of many partitions hold a few records per partition.
SMALL_RUN = 256


def decode_batches(batches: list[tuple[bytes | memoryview, BatchHeader]]) -> KafkaColumns:
    """The records of several whole record batches of one partition, in order, as one
    set of columns.

    A decode has a fixed cost whatever the batch holds, and producers that linger little
    or spread a modest rate over many partitions send batches of a handful of records:
    decoded one by one, that cost was most of a gateway's CPU (32 partitions at 10 k
    rec/s: ~3,000 batches a second). Joined, a fetch response's batches pay it once, and
    a small run goes through the cheaper reader (:data:`SMALL_RUN`). Each batch is
    still checked on its own: its records fill exactly its bytes.
    """
    if sum(h.count for _, h in batches) <= SMALL_RUN:
        small = _read_small(batches)
        if small is not None:
            return small
    return _decode_sections([(records_section(b, h), h) for b, h in batches])


def _read_small(batches: list[tuple[bytes | memoryview, BatchHeader]]) -> KafkaColumns | None:
    """A small run through aiokafka's (C) record reader; None when that reader cannot
    read it exactly — a header key that is not UTF-8 (the numpy pass keeps its bytes) or
    damaged bytes, whose error the numpy pass words precisely."""
    try:
        records = [r for batch, _ in batches for r in DefaultRecordBatch(bytearray(batch))]
    except Exception:
        return None
    n = len(records)
    if n != sum(h.count for _, h in batches):
        return None
    return KafkaColumns(
        np.fromiter((r.offset for r in records), np.int64, count=n),
        np.fromiter((r.timestamp for r in records), np.int64, count=n),
        np.fromiter((r.timestamp_type for r in records), np.int8, count=n),
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        build_headers([r.headers for r in records]),
    )


def _decode_sections(sections: list[tuple[bytes | memoryview, BatchHeader]]) -> KafkaColumns:
    """Decompressed record sections, back to back, in one numpy pass."""
    # One copy: the batches back to back, and zero bytes after them so every gather of
    # up to ten bytes stays inside.
    data = b"".join([*(part for part, _ in sections), bytes(_PAD)])
    starts_list: list[int] = []
    pos = 0
    for part, header in sections:
        _walk_records(data, pos, pos + len(part), header.count, starts_list)
        pos += len(part)
    starts = np.array(starts_list, np.int64)
    n = len(starts)
    padded = pa.py_buffer(data)
    buf = np.frombuffer(padded, np.uint8)
    ends = np.append(starts[1:], pos)
    _, size = varints_at(buf, starts, 5)  # the length: _walk_records checked it
    at = starts + size + 1  # the attributes byte (unused in magic 2)
    ts_delta, size = varints_at(buf, _within(at, ends), 10)
    at += size
    offset_delta, size = varints_at(buf, _within(at, ends), 5)
    at += size
    key_len, size = varints_at(buf, _within(at, ends), 5)
    at += size
    keys = binary_at(padded, buf, _within(at, ends), key_len)
    at += np.maximum(key_len, 0)
    value_len, size = varints_at(buf, _within(at, ends), 5)
    at += size
    values = binary_at(padded, buf, _within(at, ends), value_len)
    at += np.maximum(value_len, 0)
    count, size = varints_at(buf, _within(at, ends), 5)
    at += size
    headers, at = _headers(padded, buf, _within(at, ends), count, ends)
    if (at != ends).any():
        raise CorruptRecordError("a record's fields do not end where its length says")
    return KafkaColumns(
        _per_record(sections, lambda h: h.base_offset, n) + offset_delta,
        _timestamps(sections, ts_delta, n),
        _per_record(sections, lambda h: h.timestamp_type, n).astype(np.int8),
        keys,
        values,
        headers,
    )


def _per_record(
    sections: list[tuple[bytes | memoryview, BatchHeader]],
    field: Callable[[BatchHeader], int],
    n: int,
) -> np.ndarray:
    """A batch header's field, repeated for each of its records."""
    if len(sections) == 1:
        return np.full(n, field(sections[0][1]), np.int64)
    counts = [h.count for _, h in sections]
    return np.repeat(np.array([field(h) for _, h in sections], np.int64), counts)


def _timestamps(
    sections: list[tuple[bytes | memoryview, BatchHeader]], deltas: np.ndarray, n: int
) -> np.ndarray:
    """CreateTime: the batch's first timestamp plus the record's delta; LogAppendTime:
    the broker's time (the batch's max timestamp) for every record, as Kafka's clients
    read it."""
    create: np.ndarray = _per_record(sections, lambda h: h.first_timestamp, n) + deltas
    if all(h.timestamp_type == 0 for _, h in sections):
        return create
    appended = _per_record(sections, lambda h: h.max_timestamp, n)
    kinds = _per_record(sections, lambda h: h.timestamp_type, n)
    out: np.ndarray = np.where(kinds == 1, appended, create)
    return out


def _within(at: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``at``, after checking that no position ran past its record's end (a corrupt
    length would otherwise send the next read into another record, or past the batch)."""
    if (at > ends).any():
        raise CorruptRecordError("a record's fields run past the end its length gives")
    return at


def _headers(
    data: pa.Buffer, buf: np.ndarray, at: np.ndarray, count: np.ndarray, ends: np.ndarray
) -> tuple[pa.Array, np.ndarray]:
    """Every record's headers (``count`` each, starting at ``at``) and where each record's
    headers end. Decoded one header position at a time across all records that have it."""
    n = len(at)
    if (count < 0).any():
        raise CorruptRecordError("a negative header count")
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(count, out=offsets[1:])
    if offsets[-1] == 0:
        empty = pa.array([], _HEADER_STRUCT)
        return pa.ListArray.from_arrays(pa.array(offsets), empty, type=HEADER_TYPE), at
    at = at.copy()
    key_at, key_len, value_at, value_len, order = [], [], [], [], []
    for j in range(int(count.max())):
        rows = np.flatnonzero(count > j)
        end = ends[rows]
        p = at[rows]
        klen, size = varints_at(buf, _within(p, end), 5)
        if (klen < 0).any():
            raise CorruptRecordError("a null header key")
        p = _within(p + size, end)
        key_at.append(p)
        key_len.append(klen)
        p = _within(p + klen, end)
        vlen, size = varints_at(buf, p, 5)
        p = _within(p + size, end)
        value_at.append(p)
        value_len.append(vlen)
        at[rows] = _within(p + np.maximum(vlen, 0), end)
        order.append(offsets[rows] + j)  # this header's place in the flat list
    place = np.concatenate(order)
    flat = np.empty(len(place), np.int64)
    flat[place] = np.arange(len(place))
    keys = binary_at(data, buf, np.concatenate(key_at)[flat], np.concatenate(key_len)[flat])
    vals = binary_at(data, buf, np.concatenate(value_at)[flat], np.concatenate(value_len)[flat])
    entries = pa.StructArray.from_arrays([keys, vals], fields=list(_HEADER_STRUCT))
    return pa.ListArray.from_arrays(pa.array(offsets), entries, type=HEADER_TYPE), at
