"""Kafka and Pulsar side by side in one gateway: the same metric names and label sets for
the quantities both have, and one Flight read and one do_put per transport through the
same client code."""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RunningGateway, pulsar_source_cfg, source_cfg
from tests.helpers import wait_until
from tests.pulsar_lite import ExternalPulsar, PulsarLite
from thalweg.embedded import TansuBroker
from thalweg_client import connect

pytestmark = pytest.mark.integration

# The shared quantities (issue 7): records, bytes, lag, consumed/durable/committed
# position, commit latency, errors by stage.
SHARED = (
    "twg_source_records_total",
    "twg_source_bytes_total",
    "twg_partition_lag_records",
    "twg_partition_consumed_position",
    "twg_partition_durable_position",
    "twg_partition_committed_position",
    "twg_commit_seconds_count",
)


def _metric_shapes(text: str, source: str) -> dict[str, set[frozenset[str]]]:
    """Sample name -> the label-name sets it appears with, for one source."""
    out: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("source") == source:
                out.setdefault(sample.name, set()).add(frozenset(sample.labels))
    return out


def _rows(rg: RunningGateway, topic: str) -> int:
    with connect(rg.flight_url) as c:
        return int(c.read(topic, lane="raw").num_rows) if topic in c.topics() else 0


def test_one_gateway_serves_kafka_and_pulsar_alike(
    broker: TansuBroker,
    pulsar_broker: PulsarLite | ExternalPulsar,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    ktopic = topic_factory(1, prefix="both-k")
    ptopic = f"both-p-{uuid.uuid4().hex[:8]}"
    rg = gateway_factory(
        [],
        sources=[
            source_cfg(broker.bootstrap, [ktopic], name="kafka-src"),
            pulsar_source_cfg(pulsar_broker.url, [ptopic], name="pulsar-src"),
        ],
    )
    table = pa.table(
        {
            "id": pa.array(range(20), pa.int64()),
            "name": [f"n{i}" for i in range(20)],
        }
    )
    keys = [f"k{i % 3}".encode() for i in range(20)]
    acks: dict[str, list[dict[str, Any]]] = {}
    # The same client code writes to and reads from either transport.
    with connect(rg.flight_url) as c:
        for topic in (ktopic, ptopic):
            acks[topic] = c.write(
                topic, table, key=keys, headers=[[{"key": b"h", "value": b"v"}]] * 20
            )
    for topic in (ktopic, ptopic):
        assert sum(a["rows"] for a in acks[topic]) == 20
        wait_until(lambda t=topic: _rows(rg, t) >= 20, 30, f"{topic} in the lane", interval=0.1)  # type: ignore[misc]
        with connect(rg.flight_url) as c:
            got = c.read(topic)
        got = got.filter(pc.is_null(got["_twg_decode_error"])).sort_by("id")
        assert got["name"].to_pylist() == table["name"].to_pylist()
        with connect(rg.flight_url) as c:
            raw = c.read(topic, lane="raw").sort_by("_twg_position")
        assert raw["_twg_source_key"].to_pylist() == keys
        assert all(
            h == [{"key": b"h", "value": b"v"}] for h in raw["_twg_source_headers"].to_pylist()
        )
        # The acknowledged positions are where the rows are.
        ranges = [r for a in acks[topic] for r in a["partitions"].values()]
        positions = raw["_twg_position"].to_pylist()
        assert min(r[0] for r in ranges) == positions[0]
        assert max(r[1] for r in ranges) == positions[-1]
    assert len(acks[ptopic][0]["message_ids"]) == 20
    assert all(a["rows"] and "message_ids" not in a for a in acks[ktopic])

    def scrape() -> str:
        with urllib.request.urlopen(f"{rg.admin_url}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    wait_until(
        lambda: all(
            n in _metric_shapes(scrape(), s) for s in ("kafka-src", "pulsar-src") for n in SHARED
        ),
        30,
        "shared metrics from both sources",
        interval=0.1,
    )
    text = scrape()
    kafka, pulsar_ = _metric_shapes(text, "kafka-src"), _metric_shapes(text, "pulsar-src")
    for name in SHARED:
        assert kafka[name] == pulsar_[name], name
    # Beyond the named ones, neither transport has a metric the other lacks.
    assert set(kafka) == set(pulsar_)


def test_pulsar_put_refuses_what_pulsar_cannot_hold(
    pulsar_broker: PulsarLite | ExternalPulsar,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    ptopic = f"put-p-{uuid.uuid4().hex[:8]}"
    rg = gateway_factory([], sources=[pulsar_source_cfg(pulsar_broker.url, [ptopic])])
    table = pa.table({"value": [b'{"a": 1}', b'{"a": 2}']})
    with connect(rg.flight_url) as c, pytest.raises(Exception, match="repeats"):
        c.write(
            ptopic,
            table,
            headers=[[{"key": b"h", "value": b"1"}, {"key": b"h", "value": b"2"}]] * 2,
        )
    with connect(rg.flight_url) as c:
        acks = c.write(ptopic, table)
    assert sum(a["rows"] for a in acks) == 2
