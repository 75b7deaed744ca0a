"""The Pulsar produce direction against a real Pulsar-protocol broker (pulsar-lite).

The writer alone (records → Pulsar messages); the source, its lanes and ``do_put`` through
the gateway are tested in ``test_pulsar_source.py`` and ``test_two_transports.py``.
"""

from __future__ import annotations

import asyncio
import uuid

import pulsar
import pytest

from tests.pulsar_lite import PulsarLite
from thalweg.errors import ThalwegError
from thalweg.records.model import Locator, RawRecord, Timestamp
from thalweg.sinks.pulsar import PulsarWriter

pytestmark = pytest.mark.integration


def record(
    value: bytes | None,
    key: bytes | None = None,
    headers: tuple[tuple[bytes, bytes | None], ...] = (),
    ts: int | None = None,
) -> RawRecord:
    return RawRecord(
        key, value, headers, Timestamp(ts, 0 if ts is not None else -1), Locator("c", "t", -1)
    )


def test_records_land_with_properties_keys_and_event_times(pulsar_broker: PulsarLite) -> None:
    topic = f"persistent://public/default/w-{uuid.uuid4().hex[:8]}"
    records = [
        record(b"a", b"k1", ((b"p", b"1"), (b"empty", b"")), 1_700_000_000_000),
        record(b"", None, (), None),  # an empty payload is not a tombstone
        record(b"x" * 200_000, b"k2", ((b"big", b"yes"),), 1_700_000_000_001),
    ]

    async def run() -> list:  # type: ignore[type-arg]
        async with PulsarWriter(pulsar_broker.url) as w:
            return await w.send_records(topic, records)

    client = pulsar.Client(pulsar_broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        consumer = client.subscribe(
            topic, "check", initial_position=pulsar.InitialPosition.Earliest
        )
        written = asyncio.run(run())
        # pulsar-lite sometimes dispatches a message to a fresh subscription more than
        # once (same id, redelivery count 0); Pulsar allows redelivery, so deduplicate by
        # message id, as the Pulsar source will have to.
        got, seen = [], set()
        while len(got) < len(records):
            m = consumer.receive(5000)
            mid = bytes(m.message_id().serialize())
            if mid not in seen:
                seen.add(mid)
                got.append(m)
            consumer.acknowledge(m)
    finally:
        client.close()
    assert [m.data() for m in got] == [r.value for r in records]
    assert got[0].properties() == {"p": "1", "empty": ""}
    assert got[0].partition_key() == "k1"
    assert got[1].partition_key() == ""
    assert got[0].event_timestamp() == 1_700_000_000_000
    assert got[1].event_timestamp() == 0  # unset
    # The returned ids are the ids a consumer sees, in order.
    assert [w.message_id for w in written] == [bytes(m.message_id().serialize()) for m in got]
    assert [(w.ledger_id, w.entry_id) for w in written] == [
        (m.message_id().ledger_id(), m.message_id().entry_id()) for m in got
    ]


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (record(None), "tombstone"),
        (record(b"v", headers=((b"h", b"1"), (b"h", b"2"))), "repeats"),
        (record(b"v", headers=((b"h", None),)), "null value"),
        (record(b"v", headers=((b"\xff", b"1"),)), "not UTF-8"),
        (record(b"v", key=b"\xff\xfe"), "key is not UTF-8"),
    ],
)
def test_what_pulsar_cannot_hold_is_refused_before_sending(
    pulsar_broker: PulsarLite, bad: RawRecord, needle: str
) -> None:
    topic = f"persistent://public/default/r-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        async with PulsarWriter(pulsar_broker.url) as w:
            await w.send_records(topic, [record(b"ok"), bad])

    with pytest.raises(ThalwegError, match=needle):
        asyncio.run(run())
    # Nothing of the batch was sent: the refusal came before the first send, so a marker
    # sent now is the topic's first message.
    client = pulsar.Client(pulsar_broker.url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        client.create_producer(topic).send(b"marker")
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert reader.read_next(5000).data() == b"marker"
    finally:
        client.close()
