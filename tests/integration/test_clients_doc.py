"""Runs every ```python block of docs/clients.md against a live gateway."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.conftest import RunningGateway

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_clients_page_runs(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    assert len(BLOCKS) >= 5
    topic = topic_factory(2)
    for i in range(200):
        record = {"id": i, "name": f"n{i}", "price": float(i % 20)}
        producer.produce(topic, json.dumps(record).encode(), partition=i % 2)
    producer.flush(10)
    gw = gateway_factory([topic])
    gw.wait_durable(topic, {0: 100, 1: 100})
    ns: dict[str, Any] = {"URL": gw.flight_url, "TOPIC": topic}
    for block in BLOCKS:
        exec(compile(block, str(DOC), "exec"), ns)  # the page's own code
        if "acks" in ns and "written" not in ns:
            # The page queries right after it writes: the record must have been ingested
            # first (a loaded machine took longer than the next block: CI, session 22).
            ns["written"] = True
            (p,) = (int(q) for q in ns["acks"][0]["partitions"])
            gw.wait_durable(topic, {p: 101, 1 - p: 100})
    # What the blocks computed is right, not merely free of exceptions.
    assert ns["table"].num_rows == 200
    assert list(ns["df"].columns) == ["id", "price"]
    assert len(ns["df"]) == 200
    assert len(ns["pl_df"]) == sum(1 for i in range(200) if i % 20 > 10)
    revenue = {p: sum(float(i % 20) for i in range(p, 200, 2)) for p in (0, 1)}
    assert ns["totals"] == [(0, 100, revenue[0]), (1, 100, revenue[1])]
    assert ns["count"] == 200
    assert sum(t.num_rows for t in ns["parts"]) == 200
    assert ns["raw"].num_rows == 200
    assert ns["acks"][0]["rows"] == 1
    sums = dict(zip(*ns["by_partition"].to_pydict().values(), strict=True))
    # Flight SQL sees the 200 records and the one the page wrote (price 1.5), live.
    (put_partition,) = (int(p) for p in ns["acks"][0]["partitions"])
    assert sums == {p: revenue[p] + (1.5 if p == put_partition else 0) for p in (0, 1)}
    ns["gw"].close()
