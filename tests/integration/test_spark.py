"""Spark (local mode) reads a topic through the gateway, endpoints spread over tasks."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.conftest import RunningGateway
from thalweg_client.spark import read_topic

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # pyspark warns about pandas 3 on import of its Arrow helpers; nothing here uses pandas.
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers need this venv's pyarrow
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("thalweg-test")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    yield session
    session.stop()


def test_spark_reads_every_endpoint_exactly_once(
    spark: Any,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(3)
    gw = gateway_factory([topic])
    for p in range(3):
        for i in range(100):
            producer.produce(topic, json.dumps({"p": p, "i": i}).encode(), partition=p)
    producer.flush(30)
    gw.wait_durable(topic, {0: 100, 1: 100, 2: 100})

    df = read_topic(spark, gw.flight_url, topic, metadata="all")
    assert df.rdd.getNumPartitions() == 3  # one task per endpoint
    rows = df.select("p", "i", "_twg_source_partition", "_twg_record_id").collect()
    assert sorted((r.p, r.i) for r in rows) == [(p, i) for p in range(3) for i in range(100)]
    assert all(r.p == r._twg_source_partition for r in rows)
    assert all(len(r._twg_record_id) == 16 for r in rows)  # widened to binary, intact
    # Filters and projections go to the gateway, not just to Spark.
    small = read_topic(
        spark, gw.flight_url, topic, columns=["i"], filter=[{"column": "i", "op": "<", "value": 10}]
    )
    assert small.columns == ["i"]
    assert small.count() == 30
