"""read_committed: aborted and control records never reach a lane; offsets still advance.

Runs against noida-db, whose Kafka transactions work with aiokafka (tansu refuses the
transactional producer and shows aborted records to read_committed consumers).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

import thalweg_client
from tests.conftest import NoidaBroker, RunningGateway
from thalweg.lane import LaneLayout, scan_coverage
from thalweg.verify import verify

pytestmark = pytest.mark.integration


async def create_topic(bootstrap: str, topic: str) -> None:
    """A topic of one partition on the broker at ``bootstrap``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, 1, 1)])
    await admin.close()


async def transactions(
    bootstrap: str, topic: str, rounds: int, start: int, create: bool
) -> list[bytes]:
    """Alternate committed and aborted transactions; return the committed values."""
    if create:
        await create_topic(bootstrap, topic)
    p = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"tx-{uuid.uuid4().hex[:6]}",
        enable_idempotence=True,
    )
    await p.start()
    committed = []
    try:
        for i in range(start, start + rounds):
            async with p.transaction():
                for j in range(3):
                    v = b"ok-%d-%d" % (i, j)
                    await p.send(topic, v, partition=0)
                    committed.append(v)
            await p.begin_transaction()
            await p.send(topic, b"aborted-%d" % i, partition=0)
            await p.abort_transaction()
    finally:
        await p.stop()
    return committed


def test_aborted_and_control_records_never_reach_the_lane(
    noida: NoidaBroker, gateway_factory: Callable[..., RunningGateway], tmp_path
) -> None:
    topic = f"tx-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    committed = asyncio.run(transactions(noida.bootstrap, topic, 10, 0, True))
    opts = {
        "bootstrap_servers": noida.bootstrap,
        "group_id": group,
        "format": "none",
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 1000,
    }
    data = tmp_path / "lane"

    def lane_values(gw: RunningGateway) -> tuple[list[bytes], list[int]]:
        with thalweg_client.connect(gw.flight_url) as c:
            raw = c.read(topic, lane="raw").sort_by("_twg_source_offset")
        return raw["_twg_source_value"].to_pylist(), raw["_twg_source_offset"].to_pylist()

    # Per round: 3 records + commit marker, 1 aborted record + abort marker = 6 offsets.
    last_data = 6 * 9 + 2
    gw = gateway_factory([topic], data_dir=data, **opts)
    gw.wait_durable(topic, {0: last_data + 1})
    values, offsets = lane_values(gw)
    assert values == committed
    assert not any(v.startswith(b"aborted") for v in values)
    assert offsets == [6 * i + j for i in range(10) for j in range(3)]
    # Coverage accounts for every position, markers and aborted records included.
    assert scan_coverage(LaneLayout(data), topic, 0).ranges == [(0, last_data + 1)]
    gw.stop()

    # A restart resumes past the markers: more transactions, no duplicate, no gap.
    more = asyncio.run(transactions(noida.bootstrap, topic, 5, 10, False))
    gw = gateway_factory([topic], data_dir=data, **opts)
    gw.wait_durable(topic, {0: 6 * 14 + 3})
    values, offsets = lane_values(gw)
    assert values == committed + more
    assert len(set(offsets)) == len(offsets)
    assert scan_coverage(LaneLayout(data), topic, 0).ranges == [(0, 6 * 14 + 3)]
    # twg verify --deep reads the broker back as the gateway did (read_committed): the
    # markers and the aborted records between the lane's rows are no mismatch and no
    # missing record; every committed record is compared, field by field.
    report = verify(gw.gateway.cfg, deep=True)
    assert report.ok and not report.unchecked, report.as_text()
    assert report.deep[f"{topic}[0]"] == {
        "from": 0,
        "to": 6 * 14 + 3,
        "compared": len(committed + more),
        "differ": 0,
        "missing": 0,
        "not_retained": 0,
        "complete": True,
    }, report.deep


def test_deep_verify_compares_past_records_the_broker_removed_since(
    noida: NoidaBroker, gateway_factory: Callable[..., RunningGateway], tmp_path
) -> None:
    """Records the lane holds and the broker removed after (retention, a DeleteRecords)
    are never a mismatch or a lost record; the records after them are still compared
    field by field. (noida-db: tansu has no DeleteRecords.)"""
    from aiokafka.admin import RecordsToDelete
    from aiokafka.structs import TopicPartition

    topic = f"dr-{uuid.uuid4().hex[:8]}"

    async def produce() -> None:
        await create_topic(noida.bootstrap, topic)
        p = AIOKafkaProducer(bootstrap_servers=noida.bootstrap)
        await p.start()
        for i in range(20):
            await p.send_and_wait(topic, b"v%d" % i, key=b"k%d" % (i % 3), partition=0)
        await p.stop()

    async def remove_below(offset: int) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=noida.bootstrap)
        await admin.start()
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(offset)}, 5000)
        await admin.close()

    asyncio.run(produce())
    opts = {
        "bootstrap_servers": noida.bootstrap,
        "group_id": f"g-{uuid.uuid4().hex[:6]}",
        "format": "none",
        "session_timeout_ms": 6000,  # noida-db's floor
        "heartbeat_interval_ms": 1000,
    }
    gw = gateway_factory([topic], data_dir=tmp_path / "lane", **opts)
    gw.wait_durable(topic, {0: 20})
    gw.stop()
    cfg = gw.gateway.cfg
    assert verify(cfg, deep=True).deep[f"{topic}[0]"]["compared"] == 20
    asyncio.run(remove_below(8))
    report = verify(cfg, deep=True)
    assert report.ok and not report.unchecked, report.as_text()
    found = report.deep[f"{topic}[0]"]
    # Compared from the broker's new log start: the 8 records it removed are neither
    # a mismatch nor missing (the lane keeps them; the broker no longer has them to say).
    assert (found["from"], found["compared"], found["differ"], found["missing"]) == (
        8,
        12,
        0,
        0,
    ), found


def test_log_append_time_is_the_brokers(
    noida: NoidaBroker, gateway_factory: Callable[..., RunningGateway]
) -> None:
    """A LogAppendTime topic: the lane holds the broker's time and says so.

    Broker-authoritative, so checked for consistency (between send and receive), not
    equality with what the producer asked for. noida-db applies LogAppendTime; tansu
    accepts the topic setting but keeps CreateTime, so this test runs on noida-db.
    """
    import time as _time

    topic = f"lat-{uuid.uuid4().hex[:8]}"

    async def make() -> tuple[int, int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=noida.bootstrap)
        await admin.start()
        await admin.create_topics(
            [NewTopic(topic, 1, 1, topic_configs={"message.timestamp.type": "LogAppendTime"})]
        )
        await admin.close()
        p = AIOKafkaProducer(bootstrap_servers=noida.bootstrap)
        await p.start()
        before = _time.time_ns() // 1_000_000
        for i in range(3):
            await p.send_and_wait(topic, b"x%d" % i, timestamp_ms=5)  # the broker overrides
        after = _time.time_ns() // 1_000_000
        await p.stop()
        return before, after

    before, after = asyncio.run(make())
    gw = gateway_factory(
        [topic],
        bootstrap_servers=noida.bootstrap,
        format="none",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    gw.wait_durable(topic, {0: 3})
    with thalweg_client.connect(gw.flight_url) as c:
        raw = c.read(topic, lane="raw").sort_by("_twg_source_offset")
    assert raw["_twg_source_timestamp_type"].to_pylist() == ["LogAppendTime"] * 3
    stamps = raw["_twg_source_timestamp"].cast("int64").to_pylist()
    assert all(before - 1000 <= ts <= after + 1000 for ts in stamps), (before, stamps, after)
    assert stamps == sorted(stamps)


def test_put_with_the_idempotent_producer(
    noida: NoidaBroker,
    gateway_factory: Callable[..., RunningGateway],
    topic_factory: Callable[..., str],
) -> None:
    """``gateway.idempotent_producer``: puts go through on a broker with idempotence
    (noida-db); on tansu, which has none, the put fails with an error that says so,
    after producing nothing."""
    topic = f"idem-{uuid.uuid4().hex[:8]}"

    asyncio.run(create_topic(noida.bootstrap, topic))
    gw = gateway_factory(
        [topic],
        bootstrap_servers=noida.bootstrap,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        format="none",
        gateway={"idempotent_producer": True},
    )
    with thalweg_client.connect(gw.flight_url) as client:
        acks = client.write(topic, pa.table({"value": [b"a", b"b", b"c"]}))
        assert acks == [{"rows": 3, "partitions": {"0": [0, 2]}}]
        gw.wait_durable(topic, {0: 3})
        assert client.read(topic, lane="raw").column("_twg_source_value").to_pylist() == [
            b"a",
            b"b",
            b"c",
        ]

    on_tansu = topic_factory(1)
    gw2 = gateway_factory([on_tansu], format="none", gateway={"idempotent_producer": True})
    with thalweg_client.connect(gw2.flight_url) as client:
        with pytest.raises(fl.FlightServerError, match="idempotent") as info:
            client.write(on_tansu, pa.table({"value": [b"x"]}))
        assert "0 rows" in str(info.value)
