"""The Pulsar produce direction against a real Pulsar-protocol broker (pulsar-lite).

The writer alone (records → Pulsar messages); the source, its lanes and ``do_put`` through
the gateway are tested in ``test_pulsar_source.py`` and ``test_two_transports.py``.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pulsar
import pytest

from tests.pulsar_lite import PulsarLite
from thalweg.errors import ThalwegError
from thalweg.pulsar.producer import PulsarWriter
from thalweg.records.model import Locator, RawRecord, Timestamp

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


def test_do_put_into_a_topic_found_by_a_pattern_source(
    pulsar_broker: PulsarLite, tmp_path: Path
) -> None:
    """A topic that no source lists but a Pulsar ``topics_pattern`` matches takes puts
    through that source; a topic nothing matches is refused before anything is sent."""
    import threading

    import pyarrow as pa

    import thalweg_client
    from tests.pulsar_lite import drain_subscription
    from thalweg.config.models import PulsarSourceConfig
    from thalweg.flight.server import GatewayFlightServer
    from thalweg.lane.layout import LaneLayout
    from thalweg.lane.read.catalog import LaneCatalog
    from thalweg.lane.read.live import LiveTail
    from thalweg.ops.metrics import Metrics
    from thalweg.records import MetadataColumns

    tag = uuid.uuid4().hex[:8]
    source = PulsarSourceConfig(
        kind="pulsar", name="p", service_url=pulsar_broker.url, topics_pattern=f"orders-{tag}-.*"
    )
    server = GatewayFlightServer(
        "grpc://127.0.0.1:0",
        LaneCatalog(LaneLayout(tmp_path), MetadataColumns(), LiveTail()),
        Metrics(),
        pattern_sources=[source],
    )
    threading.Thread(target=server.serve, daemon=True).start()
    topic = f"orders-{tag}-eu"
    try:
        drain_subscription(pulsar_broker.url, topic, "check", wait_ms=200)  # subscribe first
        with thalweg_client.connect(server.url) as client:
            acks = client.write(topic, pa.table({"value": [b"one", b"two"], "key": ["a", "b"]}))
            assert sum(a["rows"] for a in acks) == 2
            assert len(acks[0]["message_ids"]) == 2
            with pytest.raises(pa.ArrowInvalid, match="not configured"):
                client.write(f"other-{tag}", pa.table({"value": [b"x"]}))
        got = drain_subscription(pulsar_broker.url, topic, "check", wait_ms=1000, limit=2)
        assert sorted(got) == [b"one", b"two"]
    finally:
        server.shutdown()
