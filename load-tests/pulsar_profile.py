"""Where a Pulsar message's time goes: the per-message floor of the Python client.

The Pulsar source's ratio to a bare ``receive`` loop is bounded by the client's API: it
hands over one object per message and one C++ call per field, with no batch-level
accessor. This probe shows that floor in numbers, on a local pulsar-lite broker:

  1. N messages (~200 B, producer-batched) are produced, then received into a list with
     the C++ consumer's ``receive`` (as the source does), timed;
  2. each getter is timed alone, over every received message (``map`` of the bound
     method, as ``records.pulsar_batch`` reads them), and the ids' fields decoded in
     bulk from their bytes (``records.pulsar_ids``, what replaced four id getters);
  3. the ids read and ``build_pulsar_raw_batch`` over the same messages, in batches of
     ``--chunk``, as the source does (the getters plus Arrow builds).

Prints µs per message for each, and the ratio a source could reach if nothing but
``receive`` (with the bare loop's own id into a set) and step 3 cost anything. Not a test.

    python load-tests/pulsar_profile.py --records 200000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from operator import methodcaller
from pathlib import Path
from typing import Any

import pulsar
from _pulsar import Timeout

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from tests.pulsar_lite import PulsarLite

from pulsar_bench import QUIET, produce, subscribe_from_start
from thalweg.records.columns import MetadataColumns
from thalweg.records.pulsar_batch import ReceivedIds, build_pulsar_raw_batch
from thalweg.records.pulsar_ids import parse_message_ids

MESSAGE_GETTERS = (
    "message_id",
    "data",
    "properties",
    "has_null_value",
    "partition_key",
    "ordering_key",
    "publish_timestamp",
    "event_timestamp",
    "producer_name",
    "redelivery_count",
    "topic_name",
)
ID_GETTERS = ("ledger_id", "entry_id", "batch_index", "serialize")


def per_message_us(items: Sequence[Any], fn: Callable[[Any], object], repeats: int = 3) -> float:
    """Best of ``repeats``: µs per item of ``list(map(fn, items))``."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        list(map(fn, items))
        best = min(best, time.perf_counter() - t)
    return best / len(items) * 1e6


def receive_all(url: str, topic: str, n: int, queue: int) -> tuple[list[Any], float]:
    """Every message, received one call each from the C++ consumer; µs per message."""
    client = pulsar.Client(url, logger=QUIET)
    consumer = subscribe_from_start(client, topic, "profile", queue)
    inner = consumer._consumer  # the source reads the C++ consumer's messages
    messages: list[Any] = []
    seen: set[bytes] = set()
    first = consumer_start = None
    while len(seen) < n:
        try:
            m = inner.receive(10_000)
        except Timeout:
            break
        if first is None:
            first = m
            consumer_start = time.perf_counter()
        key = m.message_id().serialize()
        if key not in seen:  # pulsar-lite dispatches some messages twice
            seen.add(key)
            messages.append(m)
    took = time.perf_counter() - (consumer_start or time.perf_counter())
    consumer.close()
    client.close()
    return messages, took / max(1, len(messages)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--queue", type=int, default=10_000, help="receiver_queue_size")
    ap.add_argument(
        "--chunk",
        type=int,
        default=10_000,
        help="messages per raw batch (the source's max_poll_records, 10000 by default)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        broker = PulsarLite(Path(d) / "pulsar")
        try:
            topic = f"profile-{uuid.uuid4().hex[:8]}"
            produce(broker.url, topic, args.records)
            messages, receive_us = receive_all(broker.url, topic, args.records, args.queue)
        finally:
            broker.stop()
    n = len(messages)
    print(f"{n:,} messages received; per message, best of 3:")
    print(f"  {'receive + id into a set (the bare loop)':44} {receive_us:6.2f} µs")
    rows: list[tuple[str, float]] = []
    for name in MESSAGE_GETTERS:
        rows.append((f"Message.{name}()", per_message_us(messages, methodcaller(name))))
    ids = list(map(methodcaller("message_id"), messages))
    for name in ID_GETTERS:
        rows.append((f"MessageId.{name}()", per_message_us(ids, methodcaller(name))))
    serialized = list(map(methodcaller("serialize"), ids))
    step = args.chunk
    chunks = [serialized[lo : lo + step] for lo in range(0, n, step)]
    bulk = per_message_us(chunks, parse_message_ids) * len(chunks) / n
    rows.append(("ids' fields decoded in bulk from their bytes", bulk))
    for label, us in sorted(rows, key=lambda r: -r[1]):
        print(f"  {label:44} {us:6.2f} µs")
    # What a raw row costs in calls now: the Message getters read per message (not the
    # topic name: with one topic named, the partition is in the id; not the publish time
    # and producer name: read once per run of an entry), the id and its bytes, and their
    # bulk decode instead of four MessageId getters.
    per_delivery = ("publish_timestamp", "producer_name", "topic_name")
    needed = [
        us
        for label, us in rows
        if (label.startswith("Message.") and label[8:-2] not in per_delivery)
        or label in ("MessageId.serialize()", "ids' fields decoded in bulk from their bytes")
    ]
    print(f"  {'sum of the calls a raw row makes per message':44} {sum(needed):6.2f} µs")
    columns = MetadataColumns()

    def build() -> None:
        for lo in range(0, n, step):  # the source's batches: up to max_poll_records
            chunk = messages[lo : lo + step]
            build_pulsar_raw_batch(
                chunk,
                topic=topic,
                partition=0,
                cluster="profile",
                ingest_ts_us=0,
                columns=columns,
                ids=ReceivedIds.of(chunk),
            )

    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        build()
        best = min(best, time.perf_counter() - t)
    build_us = best / n * 1e6
    print(f"  {'ids + build_pulsar_raw_batch (as the source)':44} {build_us:6.2f} µs")
    # The source's own work beyond the bare loop's: the ids read and the row built (one
    # topic named: the partition comes from the ids, no topic name per message).
    floor_us = receive_us + build_us
    print(
        f"a source that did nothing but receive, read ids and build rows: "
        f"{floor_us:.2f} µs a message, {receive_us / floor_us:.2f}x the bare loop at best"
    )


if __name__ == "__main__":
    main()
