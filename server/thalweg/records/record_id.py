"""Deterministic record ids, computed per batch with numpy (no per-record hashing).

An id is 16 bytes: an 8-byte BLAKE2b digest of ``(cluster, topic, partition)`` followed
by the 8-byte big-endian position (the Kafka offset). It is a pure function of where the
record lives, so a replayed or redelivered record gets the same id, ids sort by offset
within a partition, and two partitions collide only if their 64-bit digests do.

A partition whose broker log stopped continuing its lane starts a new *epoch*
(``thalweg.lane.epochs``): the same offsets then name other records, so epochs above 0
mix the epoch into the digest. Epoch 0 keeps the original derivation, so lanes written
before epochs existed keep their ids.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from thalweg.errors import InvariantError
from thalweg.records.columns import RECORD_ID_TYPE, MetadataColumns


@lru_cache(maxsize=4096)
def partition_digest(cluster: str, topic: str, partition: int, epoch: int = 0) -> bytes:
    """The 8-byte prefix shared by every id of one partition (in one epoch)."""
    parts = [cluster.encode(), topic.encode(), str(partition).encode()]
    if epoch:
        parts.append(f"epoch={epoch}".encode())
    material = b"\x00".join(parts)
    return hashlib.blake2b(material, digest_size=8, person=b"thalweg-rid-v1").digest()


def record_ids(
    cluster: str, topic: str, partition: int, offsets: npt.NDArray[np.int64], epoch: int = 0
) -> pa.FixedSizeBinaryArray:
    """Ids for ``offsets`` of one partition, as a ``fixed_size_binary(16)`` array."""
    n = len(offsets)
    out = np.empty((n, 16), dtype=np.uint8)
    digest = partition_digest(cluster, topic, partition, epoch)
    out[:, :8] = np.frombuffer(digest, dtype=np.uint8)
    out[:, 8:] = offsets.astype(">i8").view(np.uint8).reshape(n, 8)
    arr = pa.Array.from_buffers(RECORD_ID_TYPE, n, [None, pa.py_buffer(out)])
    if not isinstance(arr, pa.FixedSizeBinaryArray):
        raise InvariantError("arr is not a pa.FixedSizeBinaryArray")
    return arr


def with_epoch_ids(
    batch: pa.RecordBatch,
    columns: MetadataColumns,
    cluster: str,
    topic: str,
    partition: int,
    epoch: int,
) -> pa.RecordBatch:
    """``batch`` (one partition's raw-lane rows) with the record ids of ``epoch``."""
    if epoch == 0:
        return batch
    positions = batch.column(columns.position).to_numpy(zero_copy_only=False).astype(np.int64)
    ids = record_ids(cluster, topic, partition, positions, epoch)
    i = batch.schema.get_field_index(columns.record_id)
    return batch.set_column(i, columns.record_id, ids)
