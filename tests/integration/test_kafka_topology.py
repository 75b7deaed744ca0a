"""Kafka topics changing under a running gateway: partitions added mid-run (on noida-db:
tansu 0.6 has no CreatePartitions, KIP-195), topics created later under a pattern."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

import thalweg_client
from tests.conftest import NoidaBroker, RunningGateway, source_cfg
from tests.helpers import assert_verified, wait_until
from thalweg.embedded.tansu import TansuBroker
from thalweg.verify import verify

pytestmark = pytest.mark.integration


def test_partitions_added_mid_run_are_consumed_from_their_first_offset_served_and_covered(
    noida: NoidaBroker,
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    admin = AdminClient({"bootstrap.servers": noida.bootstrap, "log_level": 2})
    topic = f"grow-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    producer = Producer({"bootstrap.servers": noida.bootstrap, "linger.ms": 5, "log_level": 2})
    for i in range(50):
        producer.produce(topic, f'{{"i": {i}}}'.encode(), partition=0)
    producer.flush(10)
    gw = gateway_factory(
        [topic],
        sources=[
            source_cfg(
                noida.bootstrap,
                [topic],
                format="json",
                metadata_max_age_ms=1000,
                session_timeout_ms=10_000,  # noida's group minimum is above the tests' 2 s
                heartbeat_interval_ms=1_000,
            )
        ],
        sinks=[
            {
                "name": "ipc",
                "kind": "arrow_ipc",
                "topics": [topic],
                "path": str(tmp_path / "ipc"),
                "commit_interval_s": 0.3,
            }
        ],
    )
    gw.wait_durable(topic, {0: 50})

    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(15)
    wait_until(
        lambda: len(producer.list_topics(topic, 5).topics[topic].partitions) == 3,
        15,
        "the producer sees three partitions",
    )
    # Produced at once, before the gateway can know the partitions exist: all of it must
    # be read from offset 0, whatever the group's offset reset would say.
    for p in (1, 2):
        for i in range(30):
            producer.produce(topic, f'{{"i": {100 * p + i}}}'.encode(), partition=p)
    producer.flush(10)

    gw.wait_durable(topic, {0: 50, 1: 30, 2: 30}, timeout=60)
    with thalweg_client.connect(gw.flight_url) as client:
        table = client.read(topic)
    seen = sorted(zip(table["_twg_source_partition"].to_pylist(),
                      table["_twg_source_offset"].to_pylist(), strict=True))  # fmt: skip
    want = [(0, o) for o in range(50)] + [(p, o) for p in (1, 2) for o in range(30)]
    assert seen == want
    for p, want_end in ((0, 50), (1, 30), (2, 30)):
        assert gw.committed(topic, p, want_end) == want_end
    # The sink covers the new partitions too (twg verify checks it against the files).
    wait_until(lambda: verify(gw.gateway.cfg, sink="ipc").ok, 30, "the sink covers them")
    assert_verified(gw.gateway.cfg)


def test_a_topics_pattern_takes_topics_created_later_and_only_whole_matches(
    broker: TansuBroker,
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    tag = uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 2})

    def create(*names: str) -> None:
        for future in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
            future.result(15)
        for n in names:
            for i in range(10):
                producer.produce(n, f'{{"i": {i}}}'.encode(), partition=0)
        producer.flush(10)

    first, later = f"pat-{tag}-a", f"pat-{tag}-b"
    # Not taken: a longer name (the pattern must match the whole name), another prefix.
    longer, other = f"pat-{tag}-bc", f"zz-pat-{tag}-a"
    create(first, longer, other)
    gw = gateway_factory(
        [],
        sources=[
            source_cfg(
                broker.bootstrap, [], topics_pattern=f"pat-{tag}-[ab]", metadata_max_age_ms=1000
            )
        ],
    )
    gw.wait_durable(first, {0: 10})
    create(later)  # while the gateway runs: found at the next metadata refresh
    gw.wait_durable(later, {0: 10}, timeout=30)
    with thalweg_client.connect(gw.flight_url) as client:
        client.write(later, pa.table({"value": [b'{"i": 99}']}))  # do_put through the pattern
        gw.wait_durable(later, {0: 11})
        assert client.read(later)["i"].to_pylist() == [*range(10), 99]
        assert longer not in client.topics() and other not in client.topics()
    end = gw.gateway.catalog.durable_end
    assert end(longer, 0) == 0 and end(other, 0) == 0
    assert_verified(gw.gateway.cfg)
