"""Live follow with a slow reader: the reader waits, the gateway does not buffer for it,
a fast reader keeps up, and past the configured lag the slow one gets a clear error."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

TOTAL = 60_000
MAX_LAG = 20_000
# ~120 MB in all. Loopback TCP buffers and gRPC's flow-control windows (which its BDP
# probe grows) held up to ~33 MiB of a stalled stream under a loaded machine (7-12 MiB
# idle); the bound sits well above that and well below the backlog.
PAD = "x" * 2000
BOUND = 48 << 20  # what a stalled stream may have had the gateway produce


def _yielded(gw: RunningGateway) -> tuple[float, float]:
    m = gw.gateway.metrics
    return (
        float(m.flight_rows.labels("do_get")._value.get()),
        float(m.flight_bytes.labels("do_get")._value.get()),
    )


def test_slow_follower_is_bounded_and_fast_follower_keeps_up(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(1)
    gw = gateway_factory(
        [topic],
        gateway={"flight": {"follow_max_lag_records": MAX_LAG, "max_streams_per_caller": 3}},
    )
    client = thalweg_client.connect(gw.flight_url)
    # Before the first record a decoded follow is refused: it would have no columns.
    with pytest.raises(pa.ArrowInvalid, match="no decoded columns yet"):
        client.stream(topic, end="follow").read_next_batch()
    producer.produce(topic, json.dumps({"i": 0, "pad": PAD}).encode(), partition=0)
    producer.flush(30)
    gw.wait_durable(topic, {0: 1})
    slow = client.stream(topic, end="follow", metadata="none")
    fast_rows: list[int] = []
    fast_bytes = [0]

    def fast() -> None:
        with thalweg_client.connect(gw.flight_url) as c:
            for batch in c.stream(topic, end="follow", metadata="none"):
                fast_rows.extend(batch.column("i").to_pylist())
                fast_bytes[0] += batch.nbytes
                if len(fast_rows) >= TOTAL:
                    return

    fast_thread = threading.Thread(target=fast, daemon=True)
    fast_thread.start()
    # A third stream fits the per-caller limit of 3 (the limit counts this host's streams
    # when auth is off); a fourth is refused until one ends.
    third = thalweg_client.connect(gw.flight_url)
    third.stream(topic, end="follow")
    active = gw.gateway.metrics.flight_active_streams
    wait_until(lambda: active._value.get() >= 3, 10, "three open streams")
    # (pyarrow raises a do_get refusal at the call or at read time, as OSError)
    with pytest.raises((OSError, fl.FlightError), match="too many open streams"):
        thalweg_client.connect(gw.flight_url).stream(topic, end="follow").read_next_batch()
    third.close()  # cancelling frees its slot

    for i in range(1, TOTAL):
        producer.produce(topic, json.dumps({"i": i, "pad": PAD}).encode(), partition=0)
        if i % 5000 == 4999:
            producer.flush(30)
    producer.flush(30)
    gw.wait_durable(topic, {0: TOTAL}, timeout=60)
    first = slow.read_next_batch()  # the slow reader takes one batch, then stalls
    fast_thread.join(60)
    assert not fast_thread.is_alive(), f"fast reader got {len(fast_rows)} of {TOTAL}"
    assert fast_rows == list(range(TOTAL))
    gw.wait_durable(topic, {0: TOTAL})

    # Nothing is kept in memory for the stalled reader: once durable, the live tail is
    # empty although the slow stream has read almost nothing.
    wait_until(
        lambda: gw.gateway.live.nbytes() == 0,
        10,
        lambda: f"an empty live tail ({gw.gateway.live.nbytes()} bytes held)",
    )
    # The stalled stream's generator ran only as far as gRPC flow control let it: what
    # it produced is bounded by transport buffers, not by the backlog.
    rows, nbytes = _yielded(gw)
    slow_rows, slow_bytes = rows - TOTAL, nbytes - fast_bytes[0]
    print(f"stalled stream: read {first.num_rows} rows; gateway produced {slow_rows:.0f} rows")
    print(f"({slow_bytes / 2**20:.1f} MiB) for it, of {nbytes / 2**20:.1f} MiB sent in all")
    assert slow_bytes < BOUND
    assert slow_rows < TOTAL / 2

    # When it reads on, it is told it fell behind, and from where to resume.
    got = [first.num_rows]

    def read_on() -> None:
        while True:
            got[0] += slow.read_next_batch().num_rows

    with pytest.raises((OSError, fl.FlightError), match=r"fell \d+ records behind") as info:
        read_on()
    assert "resume from positions {0: " in str(info.value)
    assert got[0] < TOTAL
    client.close()
    wait_until(lambda: active._value.get() == 0, 10, "the streams to be released")
