"""Hand-built Flight ``DoPut`` streams, for feeding the gateway input no well-behaved
client would send (truncated or corrupted IPC). Speaks gRPC directly with grpcio."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pyarrow as pa

DO_PUT = "/arrow.flight.protocol.FlightService/DoPut"


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def bytes_field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def flight_data(header: bytes, body: bytes = b"", path: list[str] | None = None) -> bytes:
    """One ``FlightData`` message (descriptor only on the first message of a put)."""
    out = b""
    if path is not None:
        descriptor = b"\x08\x01" + b"".join(bytes_field(3, p.encode()) for p in path)  # PATH
        out += bytes_field(1, descriptor)
    out += bytes_field(2, header)
    if body:
        out += bytes_field(1000, body)
    return out


def ipc_parts(obj: pa.Schema | pa.RecordBatch) -> tuple[bytes, bytes]:
    """The IPC message of ``obj`` split into its flatbuffer header and its body."""
    message = pa.ipc.read_message(obj.serialize())
    body = message.body.to_pybytes() if message.body is not None else b""
    return message.metadata.to_pybytes(), body


def do_put_raw(target: str, messages: list[bytes], timeout: float = 10) -> list[bytes]:
    """Send raw ``FlightData`` messages; returns the PutResults or raises grpc.RpcError."""
    with grpc.insecure_channel(target) as channel:
        call = channel.stream_stream(
            DO_PUT, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )

        def requests() -> Iterator[bytes]:
            yield from messages

        return list(call(requests(), timeout=timeout))
