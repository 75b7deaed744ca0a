"""do_put against hostile or broken input: clean errors, the server stays up, and
nothing (or exactly what was acknowledged) is produced."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import grpc
import pyarrow as pa
import pyarrow.flight as fl
import pytest

import thalweg_client
from tests.conftest import RunningGateway
from tests.flight_wire import do_put_raw, flight_data, ipc_parts

pytestmark = pytest.mark.integration


def _write_all(
    writer: fl.FlightStreamWriter,
    batches: list[pa.RecordBatch],
    reader: fl.FlightMetadataReader | None = None,
    acks: list[dict[str, object]] | None = None,
) -> None:
    for batch in batches:
        writer.write_batch(batch)
        if reader is not None and acks is not None:
            ack = reader.read()
            if ack is None:  # the server ended the call; close() raises its error
                break
            acks.append(json.loads(ack.to_pybytes()))
    writer.done_writing()
    writer.close()


@pytest.fixture
def put_gateway(
    topic_factory: Callable[..., str], gateway_factory: Callable[..., RunningGateway]
) -> tuple[str, RunningGateway]:
    topic = topic_factory(1)
    gw = gateway_factory(
        [topic],
        format="none",
        gateway={"flight": {"max_batch_bytes": 4096, "max_put_bytes": 10_000}},
    )
    return topic, gw


def _raw_put(gw: RunningGateway, topic: str, batch: pa.RecordBatch, body: bytes) -> None:
    schema_header, _ = ipc_parts(batch.schema)
    header, _ = ipc_parts(batch)
    do_put_raw(
        gw.flight_url.removeprefix("grpc://"),
        [flight_data(schema_header, path=["topics", topic]), flight_data(header, body)],
    )


def test_truncated_and_corrupt_ipc_are_refused(put_gateway: tuple[str, RunningGateway]) -> None:
    topic, gw = put_gateway
    batch = pa.record_batch({"value": [b"aaaa", b"bbbb"]})
    _, body = ipc_parts(batch)
    # 1. The body cut short of what the header declares.
    with pytest.raises(grpc.RpcError) as info:
        _raw_put(gw, topic, batch, body[: len(body) // 2])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "0 rows were produced" in info.value.details()
    # 2. Offsets pointing past the end of the data (only full validation sees this).
    good = (0).to_bytes(4, "little") + (4).to_bytes(4, "little") + (8).to_bytes(4, "little")
    assert good in body
    bad = body.replace(good, good[:8] + (1000).to_bytes(4, "little"))
    with pytest.raises(grpc.RpcError) as info:
        _raw_put(gw, topic, batch, bad)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "0 rows were produced" in info.value.details()
    # 3. Not IPC at all.
    with pytest.raises(grpc.RpcError) as info:
        do_put_raw(
            gw.flight_url.removeprefix("grpc://"),
            [flight_data(b"\x01\x02garbage", path=["topics", topic])],
        )
    assert info.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNKNOWN)
    # The server still serves a good put, and its rows are the topic's first: nothing
    # of the refused puts was produced.
    with thalweg_client.connect(gw.flight_url) as client:
        assert client.write(topic, batch) == [{"rows": 2, "partitions": {"0": [0, 1]}}]


def test_oversize_batches_and_puts_are_refused_saying_what_landed(
    put_gateway: tuple[str, RunningGateway],
) -> None:
    topic, gw = put_gateway
    client = fl.FlightClient(gw.flight_url)
    desc = fl.FlightDescriptor.for_path("topics", topic)
    big = pa.record_batch({"value": [b"x" * 5000]})  # over max_batch_bytes = 4096
    writer, _ = client.do_put(desc, big.schema)
    with pytest.raises(pa.ArrowInvalid, match=r"exceeds gateway.flight.max_batch_bytes"):
        _write_all(writer, [big])
    # Batches under the batch cap, but together over max_put_bytes = 10_000: the first
    # ones are produced and acknowledged, and the refusal says how many rows landed.
    small = pa.record_batch({"value": [b"y" * 3000]})
    writer, reader = client.do_put(desc, small.schema)
    acks: list[dict[str, object]] = []
    with pytest.raises(pa.ArrowInvalid, match=r"max_put_bytes") as info:
        _write_all(writer, [small] * 5, reader, acks)
    landed = sum(int(str(a["rows"])) for a in acks)
    assert 1 <= landed < 5
    assert f"{landed} rows were produced" in str(info.value)
    assert acks[0] == {"rows": 1, "partitions": {"0": [0, 0]}}  # the big batch: not produced
    gw.wait_durable(topic, {0: landed})
    with thalweg_client.connect(gw.flight_url) as c:
        assert c.read(topic, lane="raw").num_rows == landed


def test_extension_types_are_refused_at_any_depth(put_gateway: tuple[str, RunningGateway]) -> None:
    topic, gw = put_gateway
    uuid = pa.array([b"0123456789abcdef"], pa.uuid())
    nested = pa.StructArray.from_arrays([uuid], names=["id"])
    with thalweg_client.connect(gw.flight_url) as client:
        for table in (
            pa.table({"value": [b"v"], "id": uuid}),
            pa.table({"value": [b"v"], "meta": nested}),
        ):
            with pytest.raises(pa.ArrowInvalid, match="extension types are not accepted"):
                client.write(topic, table)
        ok = pa.table({"value": [b"v"]})
        assert client.write(topic, ok) == [{"rows": 1, "partitions": {"0": [0, 0]}}]


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_broker_failure_mid_put_says_exactly_what_was_produced(
    compression: str,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    """The broker becomes unreachable between two batches of one put: the first batch is
    acknowledged with its offsets, the put fails naming the rows produced before it —
    with compressed batches too (the values shrink, so they are sent compressed)."""
    from tests.tcp_proxy import TcpProxy
    from thalweg.embedded import TansuBroker, free_port

    proxy_port = free_port()
    broker = TansuBroker(advertised_port=proxy_port).start()
    proxy = TcpProxy(proxy_port, broker.port)
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        topic = "put-" + topic_factory(1)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 2})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
        gw = gateway_factory(
            [topic],
            bootstrap_servers=f"127.0.0.1:{proxy_port}",
            format="none",
            produce_compression=compression,
            gateway={"put_timeout_ms": 3000},
        )
        client = fl.FlightClient(gw.flight_url)
        batch = pa.record_batch({"value": [b"a" * 300, b"b" * 300, b"c" * 300]})
        writer, reader = client.do_put(fl.FlightDescriptor.for_path("topics", topic), batch.schema)
        acks: list[dict[str, object]] = []
        writer.write_batch(batch)
        acks.append(json.loads(reader.read().to_pybytes()))
        assert acks == [{"rows": 3, "partitions": {"0": [0, 2]}}]
        proxy.cut()
        with pytest.raises(fl.FlightServerError, match=r"failed after 3 rows"):
            _write_all(writer, [batch], reader, acks)
        proxy.restore()
        gw.wait_durable(topic, {0: 3})  # exactly the acknowledged rows, none of the rest
        time.sleep(1.0)
        assert gw.gateway.catalog.high_water(topic, 0) == 3
        gw.stop()  # while the broker is reachable: leaving the group needs it
    finally:
        proxy.cut()
        broker.stop()
