"""``kind = "flight"``: a gateway following another gateway's topic over Flight
``do_get`` — each upstream partition a partition here, the upstream's positions the
positions — caught up with history, following the live edge, and resumed after a
restart from its committed positions: every record once."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from tests.conftest import RunningGateway
from tests.helpers import kill_at, run_until, start_stream, stream_config
from tests.integration.test_ipc_drops import drop

pytestmark = pytest.mark.integration

P = "_twg_"


def produce(producer: Producer, topic: str, first: int, n: int) -> None:
    for i in range(first, first + n):
        producer.produce(topic, json.dumps({"id": i, "v": i * 0.5}).encode(), partition=i % 2)
    producer.flush(10)


def decoded(data: Path, topic: str) -> list[tuple[int, int, int]]:
    files = sorted((data / "decoded" / f"topic={topic}").rglob("*.parquet"))
    out: list[tuple[int, int, int]] = []
    for f in files:
        t = pq.read_table(f, columns=["id", f"{P}source_partition", f"{P}position"])
        out += list(zip(*(c.to_pylist() for c in t.columns), strict=True))
    return sorted(out)


def following(up: RunningGateway, topic: str) -> dict[str, object]:
    """A flight source following ``topic`` of the gateway ``up`` into "mirror"."""
    return {
        "kind": "flight",
        "name": "upstream",
        "topics": ["mirror"],
        "upstream_topic": topic,
        "location": up.flight_url,
        "retry_s": 0.2,
    }


def test_a_gateway_follows_another_and_resumes_after_a_restart(
    tmp_path: Path,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(2)
    produce(producer, topic, 0, 400)
    up = gateway_factory([topic])
    up.wait_durable(topic, {0: 200, 1: 200})
    follower = following(up, topic)
    data = tmp_path / "down"
    down = gateway_factory([], sources=[follower], data_dir=data)
    down.wait_durable("mirror", {0: 200, 1: 200})
    produce(producer, topic, 400, 100)  # the live edge
    down.wait_durable("mirror", {0: 250, 1: 250})
    down.stop()

    produce(producer, topic, 500, 100)  # while the follower is down
    down2 = gateway_factory([], sources=[follower], data_dir=data)
    down2.wait_durable("mirror", {0: 300, 1: 300})
    down2.stop()

    got = decoded(data, "mirror")
    assert [r[0] for r in sorted(got, key=lambda r: r[0])] == list(range(600))  # each once
    upstream = decoded(up.data_dir, topic)
    assert got == upstream  # same rows, partitions and positions
    raw = pq.read_table(data / "raw" / "topic=mirror")
    ids = pq.read_table(up.data_dir / "raw" / f"topic={topic}", columns=[f"{P}record_id"])
    # Provenance: the upstream record id of each row.
    assert set(raw[f"{P}source_message_id"].to_pylist()) == set(ids.column(0).to_pylist())
    state = json.loads((data / "sources" / "upstream" / "positions.json").read_text())
    assert state["positions"] == {"0": 300, "1": 300}


def test_a_follower_killed_twice_resumes_with_every_record_once(
    tmp_path: Path,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(2)
    produce(producer, topic, 0, 60_000)
    # Small upstream segments: do_get serves a segment as one batch, and a follower
    # taking 30,000 rows a step could pass both kill points between two looks.
    up = gateway_factory([topic], raw_lane={"roll_rows": 3000})
    up.wait_durable(topic, {0: 30_000, 1: 30_000}, timeout=120)
    data = tmp_path / "down"
    source = f"""kind = "flight"
name = "upstream"
topics = ["mirror"]
upstream_topic = "{topic}"
location = "{up.flight_url}"
retry_s = 0.2
max_records_per_s = 10000"""
    config = stream_config(tmp_path / "thalweg.toml", data, source, roll_rows=2000)
    state = data / "sources" / "upstream" / "positions.json"

    def committed() -> int:
        try:
            return sum(json.loads(state.read_text())["positions"].values())
        except (FileNotFoundError, ValueError):
            return 0

    log = tmp_path / "follower.log"
    kill_at(lambda: start_stream(config, log), committed, (10_000, 30_000), 60_000)
    run_until(lambda: start_stream(config, log), lambda: committed() == 60_000, "all records")
    got = decoded(data, "mirror")
    assert len(got) == len(set(got)) == 60_000
    assert got == decoded(up.data_dir, topic)


def test_a_partition_the_upstream_adds_is_followed_too(
    tmp_path: Path,
    gateway_factory: Callable[..., RunningGateway],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The upstream streams Arrow IPC drops: each new file is a new partition there,
    which the follower finds at its next listing."""
    import thalweg.sources.flight

    monkeypatch.setattr(thalweg.sources.flight, "LIST_EVERY_S", 0.3)
    drops = tmp_path / "drops"
    drops.mkdir()
    drop(drops, "a.arrows", pa.table({"id": list(range(50))}))
    ipc = {
        "kind": "arrow_ipc",
        "name": "drops",
        "topics": ["events"],
        "directory": str(drops),
        "poll_interval_s": 0.1,
        "settle_s": 0,
    }
    up = gateway_factory([], sources=[ipc], data_dir=tmp_path / "up")
    up.wait_durable("events", {0: 50})
    follower = following(up, "events")
    down = gateway_factory([], sources=[follower], data_dir=tmp_path / "down")
    down.wait_durable("mirror", {0: 50})
    drop(drops, "b.arrows", pa.table({"id": list(range(50, 80))}))  # partition 1 upstream
    up.wait_durable("events", {0: 50, 1: 30})
    down.wait_durable("mirror", {0: 50, 1: 30})
    down.stop()
    assert sorted(r[0] for r in decoded(tmp_path / "down", "mirror")) == list(range(80))
