"""Passthrough byte identity: every compression codec, long topic names, 1 MB values.

Recompression is not byte-stable, so identity is asserted on the decompressed record
bytes: what the producer handed its client is what the raw lane holds.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable

import pyarrow.dataset as ds
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import thalweg_client
from tests.conftest import RunningGateway
from thalweg.embedded import TansuBroker

pytestmark = pytest.mark.integration

CODECS = ("gzip", "snappy", "lz4", "zstd")


def payloads(seed: int) -> list[tuple[bytes | None, bytes | None]]:
    rng = random.Random(seed)
    rows: list[tuple[bytes | None, bytes | None]] = [
        (None, b""),
        (b"", None),
        (b"k", bytes(range(256))),
        (b"big", rng.randbytes(1_000_000)),  # 1 MB, incompressible
        (b"zeros", bytes(200_000)),  # very compressible
    ]
    rows += [
        (rng.randbytes(rng.randint(0, 16)), rng.randbytes(rng.randint(0, 4096))) for _ in range(200)
    ]
    return rows


def test_every_codec_round_trips_bytes(
    broker: TansuBroker, gateway_factory: Callable[..., RunningGateway]
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 2})
    long_name = ("long-" + uuid.uuid4().hex).ljust(249, "x")
    topics = {codec: f"codec-{codec}-{uuid.uuid4().hex[:8]}" for codec in CODECS}
    topics["none-longname"] = long_name
    # Kafka itself forbids non-ASCII names; tansu does not, and the lane must cope
    # (percent-encoded in the Hive directory, decoded by readers).
    unicode_name = f"ördrés-主题-{uuid.uuid4().hex[:6]}"
    topics["none-unicode"] = unicode_name
    futures = admin.create_topics([NewTopic(t, 1, 1) for t in topics.values()])
    for f in futures.values():
        f.result(10)
    sent: dict[str, list[tuple[bytes | None, bytes | None]]] = {}
    for i, (codec, topic) in enumerate(topics.items()):
        compression = codec if codec in CODECS else "none"
        p = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "compression.type": compression,
                "message.max.bytes": 2_000_000,
                "linger.ms": 20,
                "log_level": 2,
            }
        )
        rows = payloads(i)
        for key, value in rows:
            p.produce(topic, value=value, key=key, partition=0)
        assert p.flush(30) == 0
        sent[topic] = rows

    gw = gateway_factory(list(topics.values()), format="none")
    gw.wait_durable(long_name, {0: len(sent[long_name])})
    for topic, rows in sent.items():
        gw.wait_durable(topic, {0: len(rows)})

    with thalweg_client.connect(gw.flight_url) as client:
        for topic, rows in sent.items():
            raw = client.read(topic, lane="raw").sort_by("_twg_source_offset")
            got = list(
                zip(
                    raw["_twg_source_key"].to_pylist(),
                    raw["_twg_source_value"].to_pylist(),
                    strict=True,
                )
            )
            assert got == rows, f"{topic}: bytes differ after the lane"
    # The long topic name is a usable Hive partition directory too.
    lane = ds.dataset(gw.data_dir / "raw", format="parquet", partitioning="hive")
    names = set(lane.to_table(columns=["topic"])["topic"].to_pylist())
    assert {long_name, unicode_name} <= names
    with thalweg_client.connect(gw.flight_url) as client:
        assert {long_name, unicode_name} <= set(client.topics())
