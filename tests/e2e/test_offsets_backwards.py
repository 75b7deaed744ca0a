"""Broker offsets that go backwards: a broker that lost its data, a topic recreated and
grown past the lane, data lost under a running gateway, on tansu and on noida-db.

Each time the gateway must hold the partition (never guess), say so in /health, /ready
and a metric, commit nothing, write nothing under an offset the lane already holds, and
— once the operator closes the epoch — ingest the new log in full in a new epoch while
the old one stays readable, with record ids that never collide.
"""

from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

import thalweg_client
from tests.conftest import NoidaBroker, RunningGateway
from tests.helpers import assert_verified, committed_offsets, produce_json, wait_until
from thalweg.cli.main import cli
from thalweg.embedded import TansuBroker, free_port
from thalweg.lane.epochs import CLOSED, epoch_layout
from thalweg.lane.layout import Lane, LaneLayout

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read()
            status = int(r.status)
    except urllib.error.HTTPError as e:
        body, status = e.read(), int(e.code)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode()


def create_topic(bootstrap: str, topic: str) -> None:
    """Create ``topic`` with one partition (a running consumer may have auto-created it
    on a broker that came back empty: that is the same topic)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def lane_rows(layout: LaneLayout, topic: str, lane: Lane = Lane.RAW) -> pa.Table:
    segs = layout.segments(lane, topic, 0)
    if not segs:
        return pa.table({})
    return pa.concat_tables(pq.read_table(s.path) for s in segs)


def held(gw: RunningGateway, topic: str) -> dict[str, Any] | None:
    """The /health entry of the held partition, once there is one."""
    _, tree = get(gw.admin_url + "/health")
    for name, comp in tree["components"].items():
        if name.endswith(f":{topic}[0]") and comp["state"] == "down":
            return dict(comp)
    return None


def assert_no_overlap(layout: LaneLayout, topic: str) -> None:
    segs = layout.segments(Lane.RAW, topic, 0)
    for a, b in itertools.pairwise(segs):
        assert a.last < b.first, f"overlapping segments {a.path.name} {b.path.name}"


@pytest.fixture
def restartable() -> Iterator[Callable[[], TansuBroker]]:
    """A tansu broker on a fixed port that a test can restart empty ("lost its data")."""
    port = free_port()
    brokers: list[TansuBroker] = []

    def fresh() -> TansuBroker:
        for b in brokers:
            b.stop()
        b = TansuBroker(port=port).start()
        brokers.append(b)
        return b

    yield fresh
    for b in brokers:
        b.stop()


def write_config(path: Path, data_dir: Path, bootstrap: str, topic: str) -> Path:
    path.write_text(
        f'[gateway]\ndata_dir = "{data_dir}"\n\n[[sources]]\nname = "test"\nkind = "kafka"\n'
        f'bootstrap_servers = "{bootstrap}"\ntopics = ["{topic}"]\n',
        encoding="utf-8",
    )
    return path


@dataclass
class FirstLog:
    """A topic's first log on a restartable broker, ingested durably by a gateway."""

    topic: str
    group: str
    data: Path
    gw: RunningGateway

    def restart_empty(self, restartable: Callable[[], TansuBroker], records: int) -> TansuBroker:
        """The broker comes back empty; the topic is recreated with ``records`` others."""
        broker = restartable()
        create_topic(broker.bootstrap, self.topic)
        produce_json(broker.bootstrap, self.topic, ({"gen": 2, "i": i} for i in range(records)))
        return broker


def first_log(
    gateway_factory: Callable[..., RunningGateway],
    broker: TansuBroker,
    tmp_path: Path,
    prefix: str,
    records: int,
) -> FirstLog:
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "lane"
    create_topic(broker.bootstrap, topic)
    produce_json(broker.bootstrap, topic, ({"gen": 1, "i": i} for i in range(records)))
    gw = gateway_factory([topic], bootstrap_servers=broker.bootstrap, data_dir=data, group_id=group)
    gw.wait_durable(topic, {0: records})
    return FirstLog(topic, group, data, gw)


def test_broker_lost_its_data_holds_the_partition_until_a_new_epoch(
    gateway_factory: Callable[..., RunningGateway],
    restartable: Callable[[], TansuBroker],
    tmp_path: Path,
) -> None:
    first = first_log(gateway_factory, restartable(), tmp_path, "lost", 300)
    topic, group, data = first.topic, first.group, first.data
    assert first.gw.committed(topic, 0, 300) == 300
    first.gw.stop()

    broker = first.restart_empty(restartable, 100)
    gw = gateway_factory([topic], bootstrap_servers=broker.bootstrap, data_dir=data, group_id=group)
    comp = wait_until(lambda: held(gw, topic), 30, "the partition held in /health")
    info = comp["info"]
    assert (info["topic"], info["partition"], info["epoch"]) == (topic, 0, 0)
    assert (info["lane_end"], info["broker_log_end"]) == (300, 100)
    assert info["reason"] == "log_end_below_lane"
    assert "lane_end=300" in comp["detail"] and "broker_log_end=100" in comp["detail"]
    assert get(gw.admin_url + "/ready")[0] == 503
    assert get(gw.admin_url + "/live")[0] == 200
    _, metrics = get(gw.admin_url + "/metrics")
    assert f'twg_partition_diverged{{partition="0",source="test",topic="{topic}"}} 1.0' in metrics
    layout = LaneLayout(data)
    raw = lane_rows(layout, topic)
    assert raw.num_rows == 300  # nothing written for the new log
    assert committed_offsets(broker.bootstrap, group, topic, [0])[0] == -1  # nothing committed

    # The operator closes the epoch with the CLI while the gateway runs.
    cfg = write_config(tmp_path / "twg.toml", data, broker.bootstrap, topic)
    out = CliRunner().invoke(cli, ["lane", "status", "-c", str(cfg)])
    assert out.exit_code == 0 and "DIVERGED" in out.output, out.output
    out = CliRunner().invoke(
        cli, ["lane", "new-epoch", "-c", str(cfg), "--topic", topic, "--partition", "0"]
    )
    assert out.exit_code == 0, out.output
    gw.wait_durable(topic, {0: 100}, timeout=30)
    assert gw.committed(topic, 0, 100) == 100
    wait_until(lambda: get(gw.admin_url + "/ready")[0] == 200, 30, "/ready back to 200")

    old = lane_rows(epoch_layout(layout, 0), topic)
    new = lane_rows(layout, topic)
    position = "_twg_source_offset"
    assert sorted(old.column(position).to_pylist()) == list(range(300))
    assert sorted(new.column(position).to_pylist()) == list(range(100))
    old_ids = set(old.column("_twg_record_id").to_pylist())
    new_ids = set(new.column("_twg_record_id").to_pylist())
    assert len(old_ids) == 300 and len(new_ids) == 100 and not old_ids & new_ids
    assert (epoch_layout(layout, 0).partition_dir(Lane.RAW, topic, 0) / CLOSED).exists()
    assert_no_overlap(layout, topic)
    with thalweg_client.connect(gw.flight_url) as client:
        table = client.read(topic)
        closed = client.read(topic, epoch=0)
        described = client.describe(topic)
    assert sorted(table.column("i").to_pylist()) == list(range(100))
    assert set(table.column("gen").to_pylist()) == {2}
    assert sorted(closed.column("i").to_pylist()) == list(range(300))  # still readable
    assert set(closed.column("gen").to_pylist()) == {1}
    assert not set(closed.column("_twg_record_id").to_pylist()) & set(
        table.column("_twg_record_id").to_pylist()
    )
    part = described["partitions"][0]
    assert (part["epoch"], part["closed_epochs"]) == (1, [0])
    out = CliRunner().invoke(cli, ["lane", "status", "-c", str(cfg)])
    assert "epoch 1 (closed: [0])" in out.output, out.output
    gw.stop()
    assert_verified(gw.gateway.cfg)  # the new epoch against the new log


def test_recreated_topic_grown_past_the_lane_fails_the_record_check(
    gateway_factory: Callable[..., RunningGateway],
    restartable: Callable[[], TansuBroker],
    tmp_path: Path,
) -> None:
    """The broker's log is longer than the lane, so its bounds look fine: only the
    record at the lane's last offset tells the logs apart. With ``on_divergence =
    "new_epoch"`` the gateway closes the epoch itself and loses nothing of the new log."""
    first = first_log(gateway_factory, restartable(), tmp_path, "grown", 200)
    topic, group, data = first.topic, first.group, first.data
    first.gw.stop()

    broker = first.restart_empty(restartable, 500)
    gw = gateway_factory(
        [topic],
        bootstrap_servers=broker.bootstrap,
        data_dir=data,
        group_id=group,
        on_divergence="new_epoch",
    )
    gw.wait_durable(topic, {0: 500}, timeout=30)
    assert gw.committed(topic, 0, 500) == 500
    layout = LaneLayout(data)
    closed = json.loads(
        (epoch_layout(layout, 0).partition_dir(Lane.RAW, topic, 0) / CLOSED).read_text()
    )
    assert closed["reason"] == "record_mismatch"
    old = lane_rows(epoch_layout(layout, 0), topic, Lane.DECODED)
    new = lane_rows(layout, topic, Lane.DECODED)
    assert sorted(old.column("i").to_pylist()) == list(range(200))
    assert set(old.column("gen").to_pylist()) == {1}
    assert sorted(new.column("i").to_pylist()) == list(range(500))
    assert set(new.column("gen").to_pylist()) == {2}
    assert_no_overlap(layout, topic)
    gw.stop()
    assert_verified(gw.gateway.cfg)


def test_the_same_log_after_a_restart_is_not_a_divergence(
    gateway_factory: Callable[..., RunningGateway], broker: TansuBroker, tmp_path: Path
) -> None:
    """The record check passes on a log that does continue the lane: no hold, no
    duplicate of the re-fetched last record, and the stream goes on."""
    topic = f"same-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "lane"
    create_topic(broker.bootstrap, topic)
    produce_json(broker.bootstrap, topic, ({"i": i} for i in range(150)))
    gw = gateway_factory([topic], data_dir=data, group_id=group)
    gw.wait_durable(topic, {0: 150})
    gw.stop()
    produce_json(broker.bootstrap, topic, ({"i": i} for i in range(150, 250)))
    gw = gateway_factory([topic], data_dir=data, group_id=group)
    gw.wait_durable(topic, {0: 250})
    assert held(gw, topic) is None
    layout = LaneLayout(data)
    raw = lane_rows(layout, topic)
    assert sorted(raw.column("_twg_source_offset").to_pylist()) == list(range(250))
    assert_no_overlap(layout, topic)
    assert gw.committed(topic, 0, 250) == 250
    gw.stop()
    assert_verified(gw.gateway.cfg)


def test_broker_loses_data_under_a_running_gateway(
    gateway_factory: Callable[..., RunningGateway],
    restartable: Callable[[], TansuBroker],
    tmp_path: Path,
) -> None:
    """tansu does not report the old position out of range after it comes back empty;
    the periodic log-end check (or the assignment's bounds check after the group is
    rebuilt) catches it."""
    first = first_log(gateway_factory, restartable(), tmp_path, "running", 300)
    topic, group, data, gw = first.topic, first.group, first.data, first.gw
    broker = first.restart_empty(restartable, 50)
    comp = wait_until(lambda: held(gw, topic), 60, "the partition held in /health")
    assert comp["info"]["reason"] == "log_end_below_lane", comp
    assert comp["info"]["broker_log_end"] == 50
    layout = LaneLayout(data)
    raw = lane_rows(layout, topic)
    assert sorted(raw.column("_twg_source_offset").to_pylist()) == list(range(300))
    assert committed_offsets(broker.bootstrap, group, topic, [0])[0] == -1
    assert get(gw.admin_url + "/ready")[0] == 503
    gw.stop()
    # The held lane is whole; the broker's shorter log is named, as a warning.
    assert_verified(gw.gateway.cfg)


def test_noida_broker_restored_empty_under_a_running_gateway(
    gateway_factory: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    """Kafka semantics: the fetch position is out of range on the empty log, the client
    resets to the log start and a fetch returns offsets the lane already holds. Held;
    never two records under one offset; never a commit backwards."""
    port = free_port()
    noida = NoidaBroker(tmp_path / "noida-1", tmp_path / "noida-1.log", port=port)
    bootstrap = noida.bootstrap
    topic = f"noida-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "lane"
    try:
        create_topic(bootstrap, topic)
        produce_json(bootstrap, topic, ({"gen": 1, "i": i} for i in range(300)))
        gw = gateway_factory(
            [topic],
            bootstrap_servers=bootstrap,
            data_dir=data,
            group_id=group,
            session_timeout_ms=6000,  # Kafka's minimum
            heartbeat_interval_ms=1000,
        )
        gw.wait_durable(topic, {0: 300})
        assert gw.committed(topic, 0, 300) == 300
        noida.stop()
        noida = NoidaBroker(tmp_path / "noida-2", tmp_path / "noida-2.log", port=port)
        create_topic(bootstrap, topic)
        produce_json(bootstrap, topic, ({"gen": 2, "i": i} for i in range(120)))
        comp = wait_until(lambda: held(gw, topic), 60, "the partition held in /health")
        assert comp["info"]["reason"] in ("log_end_below_lane", "offset_went_back"), comp
        layout = LaneLayout(data)
        raw = lane_rows(layout, topic)
        assert sorted(raw.column("_twg_source_offset").to_pylist()) == list(range(300))
        assert_no_overlap(layout, topic)
        assert committed_offsets(bootstrap, group, topic, [0])[0] in (-1, 300)
        gw.stop()
        assert_verified(gw.gateway.cfg)
    finally:
        noida.stop()


def test_noida_topic_deleted_and_recreated_while_the_gateway_was_stopped(
    gateway_factory: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    """Kafka semantics: the recreated topic starts again at offset 0 and grows past the
    lane's end, while the group may still hold its old commit. Held by the record check;
    once the operator closes the epoch, all of the new log is ingested and committed."""
    noida = NoidaBroker(tmp_path / "noida", tmp_path / "noida.log")
    bootstrap = noida.bootstrap
    topic = f"recreated-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "lane"
    opts: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "data_dir": data,
        "group_id": group,
        "session_timeout_ms": 6000,  # Kafka's minimum
        "heartbeat_interval_ms": 1000,
    }
    try:
        create_topic(bootstrap, topic)
        produce_json(bootstrap, topic, ({"gen": 1, "i": i} for i in range(300)))
        gw = gateway_factory([topic], **opts)
        gw.wait_durable(topic, {0: 300})
        assert gw.committed(topic, 0, 300) == 300
        gw.stop()
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
        admin.delete_topics([topic])[topic].result(15)
        wait_until(lambda: topic not in admin.list_topics(timeout=5).topics, 15, "deleted")
        create_topic(bootstrap, topic)
        produce_json(bootstrap, topic, ({"gen": 2, "i": i} for i in range(500)))

        gw = gateway_factory([topic], **opts)
        comp = wait_until(lambda: held(gw, topic), 60, "the partition held in /health")
        assert comp["info"]["reason"] in ("record_mismatch", "offset_went_back"), comp
        layout = LaneLayout(data)
        assert lane_rows(layout, topic).num_rows == 300
        cfg = write_config(tmp_path / "twg.toml", data, bootstrap, topic)
        out = CliRunner().invoke(
            cli, ["lane", "new-epoch", "-c", str(cfg), "--topic", topic, "--partition", "0"]
        )
        assert out.exit_code == 0, out.output
        gw.wait_durable(topic, {0: 500}, timeout=60)
        assert gw.committed(topic, 0, 500) == 500
        new = lane_rows(layout, topic, Lane.DECODED)
        assert sorted(new.column("i").to_pylist()) == list(range(500))
        assert set(new.column("gen").to_pylist()) == {2}
        old = lane_rows(epoch_layout(layout, 0), topic, Lane.DECODED)
        assert sorted(old.column("i").to_pylist()) == list(range(300))
        assert_no_overlap(layout, topic)
        gw.stop()
        assert_verified(gw.gateway.cfg)
    finally:
        noida.stop()
