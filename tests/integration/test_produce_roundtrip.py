"""consume → each representation → produce → consume, checked field by field.

Broker-authoritative fields (offset; the timestamp of a LogAppendTime topic; leader epoch)
are checked for consistency, not equality: the broker assigns them again on produce.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.corpus.edge_records import EDGES
from tests.integration.test_fidelity import produce_edges
from thalweg.embedded import TansuBroker
from thalweg.kafka.producer import KafkaWriter
from thalweg.records import MetadataColumns
from thalweg.records.columns import MetadataPolicy
from thalweg.records.convert import records_from_batch, values_from_tables

pytestmark = pytest.mark.integration
COLS = MetadataColumns()


def fields(row: dict[str, Any]) -> tuple[Any, ...]:
    """The per-field predicate: what must be equal after a produce round trip."""
    return (
        row["_twg_source_key"],
        row["_twg_source_value"],
        row["_twg_source_headers"],
        row["_twg_source_timestamp"],
        row["_twg_source_timestamp_type"],
        row["_twg_source_partition"],
    )


def test_every_representation_produces_back_identically(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    source = topic_factory(1)
    targets = {name: topic_factory(1, prefix=name) for name in ("records", "batch", "values")}
    produce_edges(broker.bootstrap, producer, source)
    gw = gateway_factory([source, *targets.values()])
    gw.wait_durable(source, {0: len(EDGES)})
    client = thalweg_client.connect(gw.flight_url)
    raw = client.read(source, lane="raw").sort_by("_twg_source_offset")
    decoded = client.read(source, metadata="all").sort_by("_twg_source_offset")

    records = records_from_batch(raw, COLS)
    # The corpus holds a record whose key and value are both null (aiokafka's own send
    # refuses one; the writer encodes its batches itself and produces it like any other).
    assert sum(1 for r in records if r.key is None and r.value is None) == 1

    async def produce_all() -> dict[str, int]:
        async with KafkaWriter(broker.bootstrap, max_request_size=2_000_000) as w:
            written = await w.send_records(targets["records"], records)
            assert [x.offset for x in written] == list(range(len(records)))
            await w.send_batch(targets["batch"], raw)
            ok = decoded.filter(pa.compute.is_null(decoded["_twg_decode_error"]))
            ok = ok.filter(pa.compute.is_valid(ok["_twg_source_value"]))
            values = values_from_tables(
                ok.select([n for n in ok.column_names if n.startswith("_twg_")]),
                ok,
                COLS,
                [f.name for f in COLS.metadata_fields(MetadataPolicy.ALL)],
            )
            await w.send_values(targets["values"], values)
            return {"records": len(records), "batch": raw.num_rows, "values": len(values)}

    counts = asyncio.run(produce_all())
    expected = [fields(r) for r in raw.to_pylist()]
    for name in ("records", "batch"):
        gw.wait_durable(targets[name], {0: counts[name]})
        back = client.read(targets[name], lane="raw").sort_by("_twg_source_offset")
        assert [fields(r) for r in back.to_pylist()] == expected, name
        # Offsets are the broker's: dense from zero in the new topic.
        assert back["_twg_source_offset"].to_pylist() == list(range(counts[name]))

    gw.wait_durable(targets["values"], {0: counts["values"]})
    back = client.read(targets["values"], metadata="all").sort_by("_twg_source_offset")
    sent = decoded.filter(pa.compute.is_null(decoded["_twg_decode_error"]))
    sent = sent.filter(pa.compute.is_valid(sent["_twg_source_value"]))
    for a, b in zip(sent.to_pylist(), back.to_pylist(), strict=True):
        assert (a["_twg_source_key"], a["_twg_source_headers"], a["_twg_source_timestamp"]) == (
            b["_twg_source_key"],
            b["_twg_source_headers"],
            b["_twg_source_timestamp"],
        )
        payload = {k: v for k, v in a.items() if not k.startswith("_twg_")}
        assert payload == {k: v for k, v in b.items() if not k.startswith("_twg_")}
    client.close()


def test_produce_batches_are_compressed_off_the_event_loop(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gzip batch costs 12 ms per MiB: it is compressed on a worker thread, never on
    the loop that serves reads and ingest, and what lands is the same records."""
    import threading

    from tests.helpers import consume_confluent
    from thalweg.kafka import wire
    from thalweg.records.model import Locator, RawRecord, Timestamp

    level, gzip = wire.CODECS["gzip"]
    threads: list[threading.Thread] = []

    def watched(data: bytes) -> bytes:
        threads.append(threading.current_thread())
        return gzip(data)

    monkeypatch.setitem(wire.CODECS, "gzip", (level, watched))
    topic = topic_factory(1)
    records = [
        RawRecord(
            b"k%d" % i, b"value %d " % i * 20, (("h", b"v"),), Timestamp(i), Locator("", topic, 0)
        )
        for i in range(20_000)
    ]

    async def put() -> threading.Thread:
        async with KafkaWriter(broker.bootstrap, compression="gzip") as w:
            written = await w.send_records(topic, records)
            assert [x.offset for x in written] == list(range(len(records)))
        return threading.current_thread()

    loop_thread = asyncio.run(put())
    assert len(threads) >= 2  # several batches, each compressed...
    assert loop_thread not in threads  # ...and none of them on the event loop
    back = consume_confluent(broker.bootstrap, topic, len(records))
    got = [(r.key, r.value) for r in back]
    assert got == [(r.key, r.value) for r in records]
