"""A follow stream over many partitions wakes for whichever partition has rows.

One ``do_get`` serves every partition of a topic. It must never wait on the partitions
one after another: a record of the one partition that receives anything reaches a
follow stream over all of them about as soon as it reaches a stream of that partition
alone. Both streams run side by side in the same test, so the comparison is a ratio
between them, never a clock.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 12
BUSY = 7  # the one partition that receives records; the other eleven stay silent
RECORDS = 30


class Arrivals(threading.Thread):
    """When each record (by its ``n``) reached one follow stream."""

    def __init__(self, reader: pa.RecordBatchReader) -> None:
        super().__init__(daemon=True)
        self.reader = reader
        self.at: dict[int, float] = {}
        self.count = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for batch in self.reader:
                now = time.monotonic()
                for n in batch.column("n").to_pylist():
                    self.count += 1
                    self.at.setdefault(n, now)
        except BaseException as exc:  # a cancel at the end is how a follow stops
            self.error = exc


def test_one_busy_partition_among_silent_ones_is_followed_as_promptly_as_alone(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(PARTITIONS, prefix="follow-many")
    for p in range(PARTITIONS):  # every partition has a decoded schema and a lane
        producer.produce(topic, b'{"n": -1}', partition=p)
    producer.flush(10)
    gw = gateway_factory([topic])
    gw.wait_durable(topic, dict.fromkeys(range(PARTITIONS), 1))
    client = thalweg_client.connect(gw.flight_url)
    every = Arrivals(client.stream(topic, end="follow", start="latest", columns=["n"]))
    alone = Arrivals(
        client.stream(topic, end="follow", start="latest", columns=["n"], partitions=[BUSY])
    )
    every.start()
    alone.start()
    sent: dict[int, float] = {}
    for n in range(RECORDS):
        sent[n] = time.monotonic()
        producer.produce(topic, f'{{"n": {n}}}'.encode(), partition=BUSY)
        producer.flush(10)
        wait_until(lambda n=n: n in every.at and n in alone.at, 30, f"record {n} on both streams")
    client.close()
    every.join(10)
    alone.join(10)

    assert every.count == alone.count == RECORDS, "a record twice, or one missing"
    lag_every = statistics.median(every.at[n] - sent[n] for n in range(RECORDS))
    lag_alone = statistics.median(alone.at[n] - sent[n] for n in range(RECORDS))
    # Waiting on the eleven silent partitions in turn (even 50 ms each) would make the
    # stream over all of them many times slower than the one over the busy partition.
    assert lag_every <= 3 * lag_alone + 0.05, (
        f"median arrival {lag_every * 1000:.0f} ms over {PARTITIONS} partitions against "
        f"{lag_alone * 1000:.0f} ms over the busy one alone"
    )
