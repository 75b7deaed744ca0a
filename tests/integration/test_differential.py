"""Differential: the same topic through aiokafka (the gateway) and confluent-kafka.

Both clients' records go through the same raw-lane builder; every field both clients
expose must agree. A difference means one client (or our adapter to it) changes data.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.corpus.edge_records import EDGES
from tests.helpers import consume_confluent
from tests.integration.test_fidelity import produce_edges
from thalweg.embedded import TansuBroker
from thalweg.records import MetadataColumns, build_raw_batch

pytestmark = pytest.mark.integration
COLS = MetadataColumns()


def test_aiokafka_and_confluent_kafka_lanes_agree(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(1)
    produce_edges(broker.bootstrap, producer, topic)
    gw = gateway_factory([topic], format="none")
    gw.wait_durable(topic, {0: len(EDGES)})
    with thalweg_client.connect(gw.flight_url) as client:
        via_aiokafka = client.read(topic, lane="raw").sort_by("_twg_source_offset")
    records = consume_confluent(broker.bootstrap, topic, len(EDGES))
    assert len(records) == len(EDGES)
    via_confluent = pa.Table.from_batches(
        [build_raw_batch(records, cluster="test", ingest_ts_us=0, columns=COLS)]
    )
    ingest = COLS.stamped("ingest_ts")
    for name in via_aiokafka.column_names:
        if name == ingest:
            continue
        a = via_aiokafka.column(name).combine_chunks()
        b = via_confluent.column(name).combine_chunks()
        assert a.equals(b), f"{name}: aiokafka and confluent-kafka disagree"
