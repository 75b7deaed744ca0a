"""The Pulsar source against a real Pulsar-protocol broker (pulsar-lite, or the full Pulsar
at ``THALWEG_PULSAR_URL``): the raw lane's Pulsar columns, edge values, every compression
codec, partitioned topics, acknowledgement only after the durable write, redelivery
deduplication, and the decoded lane through the Kafka codecs unchanged.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pulsar
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from tests.conftest import (
    PULSAR_PARTITIONS,
    RunningGateway,
    needs_full_pulsar,
    pulsar_source_cfg,
)
from tests.helpers import wait_until
from tests.pulsar_lite import ExternalPulsar, PulsarLite, drain_subscription
from thalweg.records.position import unpack_position
from thalweg_client import connect

pytestmark = pytest.mark.integration

Broker = PulsarLite | ExternalPulsar
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


def client_for(url: str) -> pulsar.Client:
    return pulsar.Client(url, logger=QUIET)


def produce(url: str, topic: str, messages: list[dict[str, Any]], **producer: Any) -> list[Any]:
    """Send ``messages`` (``send`` keyword arguments plus ``content``) in order; their ids."""
    client = client_for(url)
    ids: list[Any] = [None] * len(messages)

    def acked(i: int) -> Callable[[Any, Any], None]:
        def done(result: Any, msg_id: Any) -> None:  # never raise on the client's thread
            ids[i] = msg_id if result == pulsar.Result.Ok else None

        return done

    producer.setdefault("block_if_queue_full", True)
    try:
        p = client.create_producer(f"persistent://public/default/{topic}", **producer)
        for i, m in enumerate(messages):  # async, so that batching batches
            p.send_async(m.pop("content"), acked(i), **m)
        p.flush()
        p.close()
    finally:
        client.close()
    assert all(i is not None for i in ids)
    return ids


def raw_lane(rg: RunningGateway, topic: str) -> Any:
    """The finished raw segments of ``topic`` (not the .tmp file being written)."""
    files = [str(f) for f in (rg.data_dir / "raw" / f"topic={topic}").glob("partition=*/*.parquet")]
    return ds.dataset(files, format="parquet").to_table()


def test_raw_lane_keeps_every_pulsar_field(
    pulsar_broker: Broker, gateway_factory: Callable[..., RunningGateway]
) -> None:
    topic = f"ps-{uuid.uuid4().hex[:10]}"
    big = b"B" * 900_000
    sent = [
        {"content": b'{"n": 0}', "partition_key": "k0", "properties": {"a": "1", "empty": ""}},
        {"content": b'{"n": 1}', "event_timestamp": 1_700_000_000_123},
        {"content": b"", "ordering_key": "ord"},  # empty payload: not a tombstone
        {"content": big, "partition_key": "big"},
        {"content": b'{"n": 4}', "properties": {"z": "last", "b": "x"}},
    ]
    ids = produce(pulsar_broker.url, topic, [dict(m) for m in sent], batching_enabled=False)
    rg = gateway_factory([], sources=[pulsar_source_cfg(pulsar_broker.url, [topic])])
    _wait_rows(rg, topic, len(sent))
    lane = raw_lane(rg, topic).sort_by("_twg_position")
    rows = lane.to_pylist()
    assert [r["_twg_source_value"] for r in rows] == [
        b'{"n": 0}',
        b'{"n": 1}',
        b"",
        big,
        b'{"n": 4}',
    ]
    for row, msg_id in zip(rows, ids, strict=True):
        assert row["_twg_source_message_id"] == msg_id.serialize()
        assert (row["_twg_source_ledger_id"], row["_twg_source_entry_id"]) == (
            msg_id.ledger_id(),
            msg_id.entry_id(),
        )
        assert unpack_position(row["_twg_position"])[:2] == (msg_id.ledger_id(), msg_id.entry_id())
        assert row["_twg_source_topic"] == topic and row["_twg_source_partition"] == 0
        assert row["_twg_source_producer_name"]
        assert row["_twg_source_redelivery_count"] == 0
        assert row["_twg_source_publish_time"] is not None
        for kafka_only in ("offset", "leader_epoch", "producer_id", "producer_epoch", "sequence"):
            assert row[f"_twg_source_{kafka_only}"] is None
        assert row["_twg_source_is_transactional"] is None
    assert [r["_twg_source_key"] for r in rows] == [b"k0", None, None, b"big", None]
    assert rows[2]["_twg_source_ordering_key"] == b"ord"
    assert list(rows[0]["_twg_source_headers"]) == [
        {"key": b"a", "value": b"1"},
        {"key": b"empty", "value": b""},  # an empty property value is kept, not dropped
    ]
    assert {h["key"] for h in rows[4]["_twg_source_headers"]} == {b"z", b"b"}
    # Event time only where the producer set it; the timestamp falls back to publish time.
    assert [r["_twg_source_event_time"] is not None for r in rows] == [
        False,
        True,
        False,
        False,
        False,
    ]
    assert int(rows[1]["_twg_source_timestamp"].timestamp() * 1000) == 1_700_000_000_123
    assert rows[0]["_twg_source_timestamp"] == rows[0]["_twg_source_publish_time"]
    assert len(set(lane["_twg_record_id"].to_pylist())) == len(sent)


def _wait_rows(rg: RunningGateway, topic: str, n: int, timeout: float = 30) -> None:
    def enough() -> bool:
        with contextlib.suppress(OSError):  # a segment renamed or repaired meanwhile
            return bool(raw_lane(rg, topic).num_rows >= n)
        return False

    def why() -> str:
        m = rg.gateway.metrics
        return (
            f"{n} rows of {topic} durable "
            f"(consumed {m.records.labels(*_labels(rg, topic))._value.get():.0f}, "
            f"buffered {m.buffered_bytes._value.get():.0f} bytes, "
            f"paused {m.paused.labels(rg.gateway.runners[0].cfg.name)._value.get():.0f})"
        )

    wait_until(enough, timeout, why, interval=0.1, check=rg.raise_errors)


def _labels(rg: RunningGateway, topic: str) -> tuple[str, str, str]:
    return (rg.gateway.runners[0].cfg.name, topic, "0")


@pytest.mark.parametrize("compression", ["NONE", "LZ4", "ZLib", "ZSTD", "SNAPPY"])
def test_every_compression_codec_lands_intact(
    compression: str, pulsar_broker: Broker, gateway_factory: Callable[..., RunningGateway]
) -> None:
    topic = f"pc-{compression.lower()}-{uuid.uuid4().hex[:8]}"
    values = [json.dumps({"i": i, "pad": "x" * (i % 50)}).encode() for i in range(300)]
    produce(
        pulsar_broker.url,
        topic,
        [{"content": v} for v in values],
        compression_type=getattr(pulsar.CompressionType, compression),
        batching_enabled=True,
        batching_max_messages=64,
    )
    rg = gateway_factory([], sources=[pulsar_source_cfg(pulsar_broker.url, [topic])])
    _wait_rows(rg, topic, len(values))
    lane = raw_lane(rg, topic).sort_by("_twg_position")
    assert lane["_twg_source_value"].to_pylist() == values
    # Batched: several messages share an entry and are told apart by batch index.
    assert pc.max(lane["_twg_source_batch_index"]).as_py() > 0
    assert pc.count_distinct(lane["_twg_position"]).as_py() == len(values)


def test_partitioned_topic_is_read_partition_by_partition(
    pulsar_partitioned: Callable[[str], tuple[str, str]],
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    url, topic = pulsar_partitioned("pp")
    sent = [{"content": json.dumps({"i": i}).encode(), "partition_key": f"k{i}"} for i in range(90)]
    produce(url, topic, [dict(m) for m in sent])
    rg = gateway_factory([], sources=[pulsar_source_cfg(url, [topic])])
    _wait_rows(rg, topic, len(sent))
    lane = raw_lane(rg, topic)
    parts = set(lane["_twg_source_partition"].to_pylist())
    assert len(parts) > 1 and parts <= set(range(PULSAR_PARTITIONS))
    assert sorted(json.loads(v)["i"] for v in lane["_twg_source_value"].to_pylist()) == list(
        range(90)
    )
    # One key, one partition.
    by_key: dict[bytes, set[int]] = {}
    for k, p in zip(
        lane["_twg_source_key"].to_pylist(), lane["_twg_source_partition"].to_pylist(), strict=True
    ):
        by_key.setdefault(k, set()).add(p)
    assert all(len(ps) == 1 for ps in by_key.values())


def test_two_partitioned_topics_of_one_source_keep_their_own_lanes(
    pulsar_partitioned: Callable[[str], tuple[str, str]],
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    """Both topics have partitions 0-2: a message's partition number alone does not say
    its lane (the one-topic shortcut of the source must not apply), its topic does."""
    url, first = pulsar_partitioned("pa")
    _, second = pulsar_partitioned("pb")
    for topic, base in ((first, 0), (second, 1000)):
        produce(
            url,
            topic,
            [
                {"content": json.dumps({"i": base + i}).encode(), "partition_key": f"k{i}"}
                for i in range(60)
            ],
        )
    rg = gateway_factory([], sources=[pulsar_source_cfg(url, [first, second])])
    for topic, base in ((first, 0), (second, 1000)):
        _wait_rows(rg, topic, 60)
        lane = raw_lane(rg, topic)
        values = sorted(json.loads(v)["i"] for v in lane["_twg_source_value"].to_pylist())
        assert values == list(range(base, base + 60))
        assert set(lane["_twg_source_topic"].to_pylist()) == {topic}
        assert len(set(lane["_twg_source_partition"].to_pylist())) > 1


def test_redelivered_messages_are_not_written_twice(
    pulsar_broker: Broker, gateway_factory: Callable[..., RunningGateway]
) -> None:
    """A second subscription delivers every message again (same ids, as after a lost
    acknowledgement); the lane already holds them, so it stays exactly as it was, and
    the new subscription is acknowledged past them."""
    topic = f"pr-{uuid.uuid4().hex[:10]}"
    produce(pulsar_broker.url, topic, [{"content": b'{"i": %d}' % i} for i in range(200)])
    first = gateway_factory([], sources=[pulsar_source_cfg(pulsar_broker.url, [topic])])
    _wait_rows(first, topic, 200)
    first.stop()
    before = raw_lane(first, topic).num_rows
    again = pulsar_source_cfg(pulsar_broker.url, [topic], subscription="second")
    second = gateway_factory([], data_dir=first.data_dir, sources=[again])
    produce(pulsar_broker.url, topic, [{"content": b'{"i": %d}' % i} for i in range(200, 250)])
    _wait_rows(second, topic, 250)
    second.stop()
    lane = raw_lane(second, topic)
    assert before == 200
    assert lane.num_rows == 250
    assert pc.count_distinct(lane["_twg_record_id"]).as_py() == 250
    # Everything the second subscription saw was acknowledged: nothing comes back.
    assert drain_subscription(pulsar_broker.url, topic, "second", wait_ms=1500) == []


def test_decoded_lane_reads_through_the_same_client(
    pulsar_broker: Broker, gateway_factory: Callable[..., RunningGateway]
) -> None:
    topic = f"pd-{uuid.uuid4().hex[:10]}"
    produce(
        pulsar_broker.url,
        topic,
        [{"content": json.dumps({"id": i, "name": f"n{i}"}).encode()} for i in range(50)]
        + [{"content": b"not json"}],
    )
    rg = gateway_factory([], sources=[pulsar_source_cfg(pulsar_broker.url, [topic])])
    _wait_rows(rg, topic, 51)
    with connect(rg.flight_url) as c:
        table = c.read(topic)
        dlq = c.read(topic, lane="dlq")
    good = table.filter(pc.is_null(table["_twg_decode_error"]))
    assert good.sort_by("id")["name"].to_pylist() == [f"n{i}" for i in range(50)]
    assert table.num_rows == 51
    assert dlq.num_rows == 1 and dlq["_twg_source_value"].to_pylist() == [b"not json"]
    assert dlq["_twg_source_message_id"][0].as_py() is not None


@needs_full_pulsar("does not support regex subscriptions")
def test_pattern_subscription_finds_topics(
    pulsar_broker: Broker, gateway_factory: Callable[..., RunningGateway]
) -> None:
    stem = f"rx{uuid.uuid4().hex[:8]}"
    topics = [f"{stem}-a", f"{stem}-b"]
    for t in topics:
        produce(pulsar_broker.url, t, [{"content": b'{"t": 1}'}])
    cfg = pulsar_source_cfg(pulsar_broker.url, [], topics_pattern=f"{stem}-.*")
    cfg.pop("topics")
    rg = gateway_factory([], sources=[cfg])
    for t in topics:
        _wait_rows(rg, t, 1)


def test_a_slow_sink_stops_receiving_and_memory_stays_bounded(
    pulsar_broker: Broker, gateway_factory: Callable[..., RunningGateway]
) -> None:
    """The same Budget as Kafka: past ``max_buffered_bytes`` the source stops receiving
    (the receiver queue fills and the broker stops dispatching), then catches up."""
    topic = f"pb-{uuid.uuid4().hex[:10]}"
    total, bound = 40_000, 1 << 20
    produce(
        pulsar_broker.url,
        topic,
        [{"content": b'{"v": "%0200d"}' % i} for i in range(total)],
        batching_enabled=True,
    )
    rg = gateway_factory(
        [],
        raw_lane={"max_buffered_bytes": bound, "roll_bytes": 256 << 10, "roll_age_s": 0.2},
        sources=[pulsar_source_cfg(pulsar_broker.url, [topic], format="none")],
    )
    release = rg.hold_writes(each_s=2.0)
    metrics = rg.gateway.metrics
    peak = 0
    paused = False
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        peak = max(peak, int(metrics.buffered_bytes._value.get()))
        paused |= metrics.paused.labels("pulsar")._value.get() == 1
        time.sleep(0.05)
    consumed_slow = metrics.records.labels("pulsar", topic, "0")._value.get()
    assert paused, "receiving never paused"
    assert consumed_slow < total / 2, "the backlog was taken into memory"
    # One fetch (at most the budget's records) may land on top of the bound.
    assert peak <= 2 * bound + (1 << 20), peak
    release.set()
    _wait_rows(rg, topic, total, timeout=60)
    lane = raw_lane(rg, topic)
    assert lane.num_rows == total
    assert pc.count_distinct(lane["_twg_position"]).as_py() == total


@needs_full_pulsar("fails chunked messages")
def test_a_chunked_message_lands_whole(
    pulsar_broker: Broker, gateway_factory: Callable[..., RunningGateway]
) -> None:
    topic = f"pk-{uuid.uuid4().hex[:10]}"
    big = bytes(range(256)) * (24 << 10)  # 6 MiB: above Pulsar's 5 MiB message limit
    produce(
        pulsar_broker.url,
        topic,
        [{"content": big}],
        batching_enabled=False,
        chunking_enabled=True,
    )
    rg = gateway_factory([], sources=[pulsar_source_cfg(pulsar_broker.url, [topic])])
    _wait_rows(rg, topic, 1)
    assert raw_lane(rg, topic)["_twg_source_value"].to_pylist() == [big]


@pytest.mark.parametrize("kind", ["exclusive", "failover", "shared", "key_shared"])
def test_every_subscription_type_acknowledges_what_is_durable(
    kind: str, pulsar_broker: Broker, gateway_factory: Callable[..., RunningGateway]
) -> None:
    """Cumulative acknowledgements (exclusive, failover) and individual ones (shared,
    key_shared) both leave nothing behind once the lane holds everything."""
    topic = f"pt-{kind}-{uuid.uuid4().hex[:8]}"
    sent = [{"content": b'{"i": %d}' % i, "partition_key": f"k{i % 5}"} for i in range(300)]
    produce(pulsar_broker.url, topic, sent, batching_max_messages=50)
    cfg = pulsar_source_cfg(pulsar_broker.url, [topic], subscription="sub", subscription_type=kind)
    rg = gateway_factory([], sources=[cfg])
    _wait_rows(rg, topic, 300)
    rg.stop()
    assert raw_lane(rg, topic).num_rows == 300
    assert drain_subscription(pulsar_broker.url, topic, "sub", kind, wait_ms=1500) == []


def test_put_into_a_partitioned_topic_reports_positions_per_partition(
    pulsar_partitioned: Callable[[str], tuple[str, str]],
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    url, topic = pulsar_partitioned("pput")
    rg = gateway_factory([], sources=[pulsar_source_cfg(url, [topic])])
    table = pa.table({"value": [b'{"i": %d}' % i for i in range(60)]})
    keys = [f"key-{i % 12}".encode() for i in range(60)]
    with connect(rg.flight_url) as c:
        acks = c.write(topic, table, key=keys)
    assert sum(a["rows"] for a in acks) == 60
    ranges = {int(p): r for a in acks for p, r in a["partitions"].items()}
    assert len(ranges) > 1 and set(ranges) <= set(range(PULSAR_PARTITIONS))
    _wait_rows(rg, topic, 60)
    lane = raw_lane(rg, topic)
    for p, (first, last) in ranges.items():
        positions = lane.filter(pc.equal(lane["_twg_source_partition"], p))["_twg_position"]
        assert (pc.min(positions).as_py(), pc.max(positions).as_py()) == (first, last)


def test_follow_over_all_partitions_picks_up_a_partition_that_starts_later(
    pulsar_partitioned: Callable[[str], tuple[str, str]],
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    """A Pulsar partition is known from its first message. A follow stream over every
    partition that began before another partition's first message still delivers it,
    from that partition's start."""
    import threading

    url, topic = pulsar_partitioned("pfol")
    first = produce(
        url, topic, [{"content": b'{"i": %d}' % i, "partition_key": "k"} for i in range(5)]
    )
    (known,) = {m.partition() for m in first}
    rg = gateway_factory([], sources=[pulsar_source_cfg(url, [topic])])
    _wait_rows(rg, topic, 5)
    assert rg.gateway.catalog.partitions(topic) == [known]
    client = connect(rg.flight_url)
    reader = client.stream(topic, end="follow")
    got: list[tuple[int, int]] = []
    done = threading.Event()

    def consume() -> None:
        for batch in reader:
            parts = batch.column("_twg_source_partition").to_pylist()
            got.extend(zip(parts, batch.column("i").to_pylist(), strict=True))
            if len(got) >= 25:
                done.set()
                return

    threading.Thread(target=consume, daemon=True).start()
    # The stream has started once it delivered the known partition's history.
    wait_until(lambda: len(got) >= 5, 30, "the follow stream's first records")
    later = produce(
        url,
        topic,
        [{"content": b'{"i": %d}' % (100 + i), "partition_key": f"k{i}"} for i in range(20)],
    )
    placed = [(m.partition(), 100 + i) for i, m in enumerate(later)]
    assert {p for p, _ in placed} - {known}, "every key hashed to the known partition"
    assert done.wait(30), f"follow delivered {got}"
    assert sorted(got) == sorted([(known, i) for i in range(5)] + placed)
    client.close()
