"""Confluent wire framing: magic byte 0, a 4-byte big-endian schema id, then the body.

Peeled per batch with numpy over the Arrow buffers (no per-record Python), and without
touching the values: the raw lane keeps every envelope intact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

HEADER = 5
MAGIC = 0


@dataclass(frozen=True, slots=True)
class Framing:
    """Per row: the schema id, or -1 with ``problem`` saying why."""

    ids: npt.NDArray[np.int64]
    null: npt.NDArray[np.bool_]  # tombstones
    short: npt.NDArray[np.bool_]  # fewer than 5 bytes
    bad_magic: npt.NDArray[np.bool_]


def peel(values: pa.Array) -> Framing:
    """Schema ids of a ``binary`` array of Confluent-framed payloads."""
    values = values.cast(pa.binary()) if values.type != pa.binary() else values
    n = len(values)
    valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    bufs = values.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32)[values.offset : values.offset + n + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.empty(0, np.uint8)
    starts = offsets[:-1].astype(np.int64)
    lengths = np.diff(offsets).astype(np.int64)
    short = valid & (lengths < HEADER)
    ok = valid & ~short
    ids = np.full(n, -1, dtype=np.int64)
    magic = np.zeros(n, dtype=np.uint8)
    s = starts[ok]
    magic[ok] = data[s]
    bad_magic = ok & (magic != MAGIC)
    good = ok & ~bad_magic
    g = starts[good]
    ids[good] = (
        (data[g + 1].astype(np.int64) << 24)
        | (data[g + 2].astype(np.int64) << 16)
        | (data[g + 3].astype(np.int64) << 8)
        | data[g + 4].astype(np.int64)
    )
    return Framing(ids, ~valid, short, bad_magic)


def zigzag_varint(n: int) -> bytes:
    """Avro's and Confluent's integer encoding: zigzag, then 7-bit groups, low first."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
