"""Records to produce, held as columns: what a ``do_put`` batch becomes.

A producer needs, per record, a key, a value, headers, a timestamp and maybe a
partition. Building a :class:`~thalweg.records.model.RawRecord` for each (three frozen
objects a record) cost about 8 µs a record — more than the produce itself; plain lists
straight from the Arrow columns cost a fraction of that (PERFORMANCE-NOTES: per-record
Python objects are where the time goes). Transports whose client wants records get them
from :meth:`ProduceRows.records`.
"""

from __future__ import annotations

from dataclasses import dataclass

from thalweg.records.model import Locator, RawRecord, Timestamp

Header = tuple[bytes, bytes | None]


@dataclass(frozen=True, slots=True)
class ProduceRows:
    """Parallel lists, one entry per record; ``partitions[i] = -1``: the partitioner's
    choice."""

    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[tuple[Header, ...]]
    timestamps_ms: list[int]
    partitions: list[int]

    def __len__(self) -> int:
        return len(self.values)

    def with_header(self, key: bytes, value: bytes) -> ProduceRows:
        """Every record with one more header, except records that already carry ``key``
        (a producer's own trace context wins over the put's)."""
        headers = [h if any(k == key for k, _ in h) else (*h, (key, value)) for h in self.headers]
        return ProduceRows(self.keys, self.values, headers, self.timestamps_ms, self.partitions)

    def records(self, cluster: str, topic: str) -> list[RawRecord]:
        """The same rows as :class:`RawRecord` objects (for clients that want them)."""
        return [
            RawRecord(
                key=self.keys[i],
                value=self.values[i],
                headers=self.headers[i],
                timestamp=Timestamp(self.timestamps_ms[i]),
                locator=Locator(cluster, topic, self.partitions[i]),
            )
            for i in range(len(self))
        ]

    @classmethod
    def of(cls, records: list[RawRecord]) -> ProduceRows:
        return cls(
            [r.key for r in records],
            [r.value for r in records],
            [tuple(r.headers) for r in records],
            [r.timestamp.ms for r in records],
            [r.locator.partition for r in records],
        )
