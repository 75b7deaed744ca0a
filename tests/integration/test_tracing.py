"""OpenTelemetry spans over OTLP/HTTP: per batch, segment, commit and Flight call, with
the producers' and callers' W3C trace context honoured."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.flight as fl
import pytest
from confluent_kafka import Producer

from tests.conftest import RunningGateway
from tests.otlp_receiver import OtlpReceiver

pytestmark = pytest.mark.integration

PRODUCER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.stop()


def test_spans_follow_records_and_calls(
    receiver: OtlpReceiver,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(1)
    gw = gateway_factory([topic], gateway={"tracing": {"otlp_endpoint": receiver.endpoint}})
    traceparent = f"00-{PRODUCER_TRACE}-b7ad6b7169203331-01"
    for i in range(10):
        producer.produce(
            topic, json.dumps({"i": i}).encode(), partition=0,
            headers=[("traceparent", traceparent.encode())] if i == 3 else None,
        )  # fmt: skip
    producer.flush(10)
    gw.wait_durable(topic, {0: 10})
    client = fl.FlightClient(gw.flight_url)
    caller = fl.FlightCallOptions(
        headers=[(b"traceparent", f"00-{CALLER_TRACE}-00f067aa0ba902b7-01".encode())]
    )
    assert client.do_get(fl.Ticket(json.dumps({"topic": topic})), options=caller).read_all()
    writer, reader = client.do_put(
        fl.FlightDescriptor.for_path("topics", topic),
        pa.schema([("value", pa.binary())]),
        options=caller,
    )
    writer.write_batch(pa.record_batch({"value": [b'{"i": 100}']}))
    reader.read()
    writer.done_writing()
    writer.close()
    gw.wait_durable(topic, {0: 11})
    gw.stop()  # flushes the exporter

    receive = receiver.named("twg.receive")
    assert receive
    assert any(link.trace_id.hex() == PRODUCER_TRACE for s in receive for link in s.links)
    assert receiver.named("twg.write")
    assert receiver.named("twg.commit")
    do_get = receiver.named("flight.do_get")
    assert [s.trace_id.hex() for s in do_get] == [CALLER_TRACE]
    (do_put,) = receiver.named("flight.do_put")
    assert do_put.trace_id.hex() == CALLER_TRACE
    # The produced record carries the put's trace context for whoever consumes it next.
    lane = ds.dataset(gw.data_dir / "raw" / f"topic={topic}", format="parquet").to_table()
    put_row = lane.filter(pc.equal(lane["_twg_source_offset"], 10)).to_pylist()[0]
    headers = {h["key"]: h["value"] for h in put_row["_twg_source_headers"]}
    assert headers[b"traceparent"] == f"00-{CALLER_TRACE}-{do_put.span_id.hex()}-01".encode()
