"""Raw-lane rows from received Pulsar messages: an entry's metadata read once per run of
the entry and spread over its messages, without mixing two entries or two runs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pulsar
import pyarrow as pa

from thalweg.records.columns import MetadataColumns
from thalweg.records.pulsar_batch import ReceivedIds, build_pulsar_raw_batch, entry_runs


@dataclass
class FakeMessage:
    """A received message as the source reads it (fields given, ``calls`` counted)."""

    ledger: int
    entry: int
    batch: int
    producer: str
    publish_ms: int
    redeliveries: int
    event_ms: int = 0
    calls: dict[str, int] = field(default_factory=dict)

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def message_id(self) -> pulsar.MessageId:
        return pulsar.MessageId(-1, self.ledger, self.entry, self.batch)

    def data(self) -> bytes:
        return f"{self.ledger}:{self.entry}:{self.batch}".encode()

    def has_null_value(self) -> bool:
        return False

    def partition_key(self) -> str:
        return ""

    def ordering_key(self) -> str:
        return ""

    def properties(self) -> dict[str, str]:
        return {}

    def publish_timestamp(self) -> int:
        self._count("publish_timestamp")
        return self.publish_ms

    def event_timestamp(self) -> int:
        return self.event_ms

    def producer_name(self) -> str:
        self._count("producer_name")
        return self.producer

    def redelivery_count(self) -> int:
        self._count("redelivery_count")
        return self.redeliveries


COLUMNS = MetadataColumns()


def build(msgs: list[FakeMessage]) -> pa.RecordBatch:
    """The raw-lane batch of ``msgs``, as the source builds it."""
    return build_pulsar_raw_batch(
        msgs,
        topic="t",
        partition=0,
        cluster="c",
        ingest_ts_us=0,
        columns=COLUMNS,
        ids=ReceivedIds.of(msgs),
    )


def test_entry_runs_split_on_entry_and_on_a_batch_index_that_does_not_rise() -> None:
    ledger = np.array([1, 1, 1, 1, 1, 2, 2, 2, 2], np.int64)
    entry = np.array([5, 5, 5, 5, 6, 0, 0, 1, 1], np.int64)
    batch = np.array([0, 1, 0, 1, 0, -1, -1, 3, 4], np.int64)
    firsts, run_of = entry_runs(ledger, entry, batch)
    # entry (1,5) delivered twice; (2,0) two messages that are not batched.
    assert firsts.tolist() == [0, 2, 4, 5, 6, 7]
    assert run_of.tolist() == [0, 0, 1, 1, 2, 3, 4, 5, 5]


def test_entry_fields_are_read_once_per_run_and_match_every_message() -> None:
    msgs = [
        # entry (3,1): three messages from producer "a"
        *(FakeMessage(3, 1, i, "a", 1000, 0) for i in range(3)),
        # entry (3,2): from producer "b", with an event time on one message
        FakeMessage(3, 2, 0, "b", 2000, 0, event_ms=1500),
        FakeMessage(3, 2, 1, "b", 2000, 0),
        # entry (3,1) redelivered right after (another count), then one unbatched message
        *(FakeMessage(3, 1, i, "a", 1000, 2) for i in range(2)),
        FakeMessage(4, 0, -1, "c", 3000, 1),
    ]
    batch = build(msgs)
    rows = batch.to_pylist()
    src = COLUMNS.source
    assert [r[src("producer_name")] for r in rows] == [m.producer for m in msgs]
    assert [r[src("redelivery_count")] for r in rows] == [m.redeliveries for m in msgs]
    assert [int(r[src("publish_time")].timestamp() * 1000) for r in rows] == [
        m.publish_ms for m in msgs
    ]
    assert [int(r[src("timestamp")].timestamp() * 1000) for r in rows] == [
        m.event_ms or m.publish_ms for m in msgs
    ]
    assert [r[src("value")] for r in rows] == [m.data() for m in msgs]
    # The entry's fields from the first message of each of the four runs only; the
    # redelivery count from every message (two deliveries can share a run).
    heads = [i for i, m in enumerate(msgs) if "producer_name" in m.calls]
    assert heads == [0, 3, 5, 7]
    for i, m in enumerate(msgs):
        entry_fields = {"publish_timestamp": 1, "producer_name": 1} if i in heads else {}
        assert m.calls == {**entry_fields, "redelivery_count": 1}


def test_the_rest_of_an_entry_from_a_second_delivery_keeps_its_own_count() -> None:
    """After a reconnect the client hands over an entry's remaining messages from the
    next delivery right behind the first delivery's: one run, two redelivery counts."""
    msgs = [
        FakeMessage(7, 3, 0, "a", 1000, 0),
        FakeMessage(7, 3, 1, "a", 1000, 0),
        FakeMessage(7, 3, 2, "a", 1000, 1),
        FakeMessage(7, 3, 3, "a", 1000, 1),
    ]
    batch = build(msgs)
    assert batch.column(COLUMNS.source("redelivery_count")).to_pylist() == [0, 0, 1, 1]
