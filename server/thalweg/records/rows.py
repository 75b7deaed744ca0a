"""Records to produce, held as Arrow columns: what a ``do_put`` batch becomes.

A producer needs, per record, a key, a value, headers, a timestamp and maybe a
partition. Building a :class:`~thalweg.records.model.RawRecord` for each (three frozen
objects a record) cost about 8 µs a record — more than the produce itself; Python lists
straight from the Arrow columns cost 0.16 µs, and keeping the columns as Arrow costs
nothing: the Kafka producer encodes its record batches from them with Arrow kernels
(:mod:`thalweg.kafka.wire`). Transports whose client wants records get them from
:meth:`ProduceRows.records`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.records.model import Locator, RawRecord, Timestamp

Header = tuple[bytes, bytes | None]

#: Headers of every record: in order, duplicate keys kept, a value may be null.
HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.binary()), pa.field("value", pa.binary())]))


@dataclass(frozen=True, slots=True)
class ProduceRows:
    """One entry per record, as columns.

    ``keys`` and ``values`` are binary arrays (null: no key, a tombstone); ``headers`` is
    :data:`HEADER_TYPE` with no null list and no null header key, or None when no record
    has a header; ``timestamps_ms`` are epoch milliseconds; ``partitions[i] = -1`` leaves
    the partition to the partitioner.
    """

    keys: pa.Array
    values: pa.Array
    headers: pa.ListArray | None
    timestamps_ms: np.ndarray
    partitions: np.ndarray

    def __len__(self) -> int:
        return len(self.values)

    def header_tuples(self) -> list[tuple[Header, ...]]:
        """Every record's headers as ``((key, value), ...)``."""
        if self.headers is None:
            return [()] * len(self)
        return [tuple((h["key"], h["value"]) for h in hs) for hs in self.headers.to_pylist()]

    def with_header(self, key: bytes, value: bytes) -> ProduceRows:
        """Every record with one more header, last, except records that already carry
        ``key`` (a producer's own trace context wins over the put's)."""
        n = len(self)
        entry = pa.array([{"key": key, "value": value}], HEADER_TYPE.value_type)
        if self.headers is None:
            headers = pa.ListArray.from_arrays(
                pa.array(np.arange(n + 1, dtype=np.int32)), pc.take(entry, np.zeros(n, np.int64))
            )
            return self._with(headers)
        old = self.headers
        offsets = np.asarray(old.offsets, dtype=np.int64)
        child_start = int(offsets[0])
        child = old.values.slice(child_start, int(offsets[-1]) - child_start)
        offsets = offsets - child_start
        parents = pc.list_parent_indices(old).to_numpy(zero_copy_only=False)
        has = np.zeros(n, bool)
        carries = pc.equal(pc.struct_field(child, "key"), pa.scalar(key, pa.binary()))
        has[parents[pc.fill_null(carries, False).to_numpy(zero_copy_only=False)]] = True
        counts = np.diff(offsets) + ~has
        new_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=new_offsets[1:])
        order = np.full(int(new_offsets[-1]), len(child), np.int64)  # len(child): the entry
        j = np.arange(len(child))
        order[new_offsets[parents] + (j - offsets[parents])] = j
        values = pc.take(pa.concat_arrays([child, entry]), order)
        headers = pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), values)
        return self._with(headers)

    def take(self, indices: np.ndarray) -> ProduceRows:
        """The rows at ``indices``, in that order (a slice when they are a run)."""
        if len(indices) and int(indices[-1]) - int(indices[0]) + 1 == len(indices):
            start, n = int(indices[0]), len(indices)
            if bool((np.diff(indices) == 1).all()):
                return ProduceRows(
                    self.keys.slice(start, n),
                    self.values.slice(start, n),
                    None if self.headers is None else self.headers.slice(start, n),
                    self.timestamps_ms[start : start + n],
                    self.partitions[start : start + n],
                )
        return ProduceRows(
            pc.take(self.keys, indices),
            pc.take(self.values, indices),
            None if self.headers is None else pc.take(self.headers, indices),
            self.timestamps_ms[indices],
            self.partitions[indices],
        )

    def _with(self, headers: pa.ListArray) -> ProduceRows:
        return ProduceRows(self.keys, self.values, headers, self.timestamps_ms, self.partitions)

    def records(self, cluster: str, topic: str) -> list[RawRecord]:
        """The same rows as :class:`RawRecord` objects (for clients that want them)."""
        keys, values = self.keys.to_pylist(), self.values.to_pylist()
        headers = self.header_tuples()
        stamps, partitions = self.timestamps_ms.tolist(), self.partitions.tolist()
        return [
            RawRecord(
                key=keys[i],
                value=values[i],
                headers=headers[i],
                timestamp=Timestamp(stamps[i]),
                locator=Locator(cluster, topic, partitions[i]),
            )
            for i in range(len(self))
        ]

    @classmethod
    def of(cls, records: list[RawRecord]) -> ProduceRows:
        """Records as columns."""
        headers = [[{"key": k, "value": v} for k, v in r.headers] for r in records]
        return cls(
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
            pa.array(headers, HEADER_TYPE) if any(headers) else None,
            np.array([r.timestamp.ms for r in records], np.int64),
            np.array([r.locator.partition for r in records], np.int64),
        )
