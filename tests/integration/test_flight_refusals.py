"""Every way the gateway refuses a Flight call, on every verb: the client reads the
message and the right gRPC status — no Python traceback, no path on the gateway.

The calls go over raw gRPC (grpcio), so the status code and the text are exactly what
any client (ADBC, Java, Go) receives; the ``x-arrow-status-*`` trailers pyarrow's client
builds its message from are checked too.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from confluent_kafka import Producer

import thalweg
from tests.conftest import RunningGateway
from tests.flight_wire import bytes_field, flight_data, ipc_parts
from tests.helpers import READER, TOKENS, WRITER

pytestmark = pytest.mark.integration

SERVICE = "/arrow.flight.protocol.FlightService/"
SERVER_ROOT = str(Path(thalweg.__file__).resolve().parent.parent)

OK_ = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
INTERNAL = grpc.StatusCode.INTERNAL
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED
UNKNOWN = grpc.StatusCode.UNKNOWN


# -- protobuf requests, by hand --------------------------------------------------------


def path_descriptor(*parts: str) -> bytes:
    return b"\x08\x01" + b"".join(bytes_field(3, p.encode()) for p in parts)


def command_descriptor(command: bytes) -> bytes:
    return b"\x08\x02" + bytes_field(2, command)


def ticket(body: bytes) -> bytes:
    return bytes_field(1, body)


def action(kind: str, body: bytes = b"") -> bytes:
    return bytes_field(1, kind.encode()) + (bytes_field(2, body) if body else b"")


def criteria(prefix: bytes) -> bytes:
    return bytes_field(1, prefix) if prefix else b""


def json_ticket(**fields: object) -> bytes:
    return json.dumps(fields).encode()


# -- calls -----------------------------------------------------------------------------


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str
    trailers: dict[str, str]


def _outcome(exc: grpc.RpcError) -> Outcome:
    trailers = {}
    for key, value in exc.trailing_metadata() or ():  # type: ignore[attr-defined]
        trailers[key] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return Outcome(exc.code(), exc.details() or "", trailers)  # type: ignore[attr-defined]


def call(
    target: str,
    method: str,
    request: bytes | list[bytes],
    token: str | None = READER,
) -> Outcome:
    """One raw call; a streaming answer is read to its end."""
    scheme = "" if token is None or token.startswith("Basic ") else "Bearer "
    metadata = [("authorization", f"{scheme}{token}")] if token else []
    ident: Callable[[bytes], bytes] = lambda b: b  # noqa: E731
    with grpc.insecure_channel(target) as channel:
        try:
            if method in ("GetFlightInfo", "GetSchema"):
                channel.unary_unary(SERVICE + method, ident, ident)(
                    request, metadata=metadata, timeout=20
                )
            elif method in ("DoPut", "DoExchange", "Handshake"):
                assert isinstance(request, list)
                messages = request
                stream = channel.stream_stream(SERVICE + method, ident, ident)(
                    iter(messages), metadata=metadata, timeout=20
                )
                list(stream)
            else:
                stream = channel.unary_stream(SERVICE + method, ident, ident)(
                    request, metadata=metadata, timeout=20
                )
                list(stream)
        except grpc.RpcError as exc:
            return _outcome(exc)
    return Outcome(OK_, "", {})


def assert_readable(out: Outcome, where: str, data_dir: Path) -> None:
    """No traceback and no gateway path, in the status text or in any trailer."""
    for text in [out.details, *out.trailers.values()]:
        for leak in (
            "Traceback",
            'File "',
            ".py",
            ".pyx",
            "site-packages",
            SERVER_ROOT,
            str(data_dir),
        ):
            assert leak not in text, f"{where}: {leak!r} in {text!r}"
    assert len(out.details) < 1200, f"{where}: {len(out.details)} characters"


# -- the walk --------------------------------------------------------------------------


@pytest.fixture
def gateway(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> tuple[RunningGateway, str, str]:
    public, secret = topic_factory(1, prefix="pub"), topic_factory(1, prefix="sec")
    for t in (public, secret):
        for i in range(3):
            producer.produce(t, json.dumps({"a": i}).encode(), partition=0)
    producer.flush(10)
    gw = gateway_factory(
        [public, secret],
        gateway={
            "auth": {
                "tokens": TOKENS,
                "users": [{"name": "ana", "password": "a-password", "read": ["pub-*"]}],
            },
            "flight": {"max_batch_bytes": 4096, "max_streams_per_caller": 1},
        },
    )
    gw.wait_durable(public, {0: 3})
    gw.wait_durable(secret, {0: 3})
    return gw, public, secret


def ticket_refusals(public: str, secret: str) -> dict[str, tuple[bytes, str]]:
    """Bad read tickets (also used as get_flight_info / get_schema commands), each with a
    piece of the message the client must read."""
    deep = b'{"topic": "x", "filter": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    return {
        "unknown topic": (json_ticket(topic="no-such-topic"), "unknown topic 'no-such-topic'"),
        "forbidden topic": (json_ticket(topic=secret), f"unknown topic '{secret}'"),
        "not json": (b"{nope", "not a JSON object"),
        "garbage bytes": (b"\xff\xfe\x00garbage", "neither a JSON object nor a protobuf"),
        "empty": (b"", "ticket"),
        "json array": (b"[1, 2]", "ticket"),
        "unknown field": (json_ticket(topic=public, bogus=1), "'bogus'"),
        "bad version": (json_ticket(topic=public, v=9), "'v'"),
        "start after end": (
            json_ticket(topic=public, start={"offset": 10}, end={"offset": 5}),
            "start {offset: 10} is after end {offset: 5}",
        ),
        "start after end (timestamps)": (
            json_ticket(topic=public, start={"timestamp_ms": 10}, end={"timestamp_ms": 5}),
            "is after end",
        ),
        "100k-deep json": (deep, "nested too deeply"),
        "oversize ticket": (
            json_ticket(topic=public, columns=["c" * 1000] * 2000),
            "tickets are limited to",
        ),
        "too many filter conditions": (
            json_ticket(topic=public, filter=[{"column": "a", "op": "is_null"}] * 65),
            "at most 64",
        ),
        "in list too long": (
            json_ticket(topic=public, filter=[{"column": "a", "op": "in", "value": [1] * 10_001}]),
            "at most 10000 values",
        ),
        "filter on an unknown column": (
            json_ticket(topic=public, filter=[{"column": "zz", "op": "is_null"}]),
            "filter column 'zz'",
        ),
        "filter value of the wrong type": (
            json_ticket(topic=public, filter=[{"column": "a", "op": "==", "value": "x"}]),
            "does not fit",
        ),
        "unknown column": (json_ticket(topic=public, columns=["zz"]), "column 'zz'"),
        "unknown partition": (json_ticket(topic=public, partitions=[7]), "no partition 7"),
        "dlq follow": (json_ticket(topic=public, lane="dlq", end="follow"), "history only"),
    }


def test_every_refusal_is_a_message_and_a_status(
    gateway: tuple[RunningGateway, str, str],
) -> None:
    gw, public, secret = gateway
    target = gw.flight_url.removeprefix("grpc://")
    seen: dict[str, Outcome] = {}

    def expect(where: str, out: Outcome, code: grpc.StatusCode, needle: str) -> None:
        seen[where] = out
        assert out.code == code, f"{where}: {out.code} {out.details!r}"
        assert needle in out.details, f"{where}: {needle!r} not in {out.details!r}"
        assert_readable(out, where, gw.data_dir)

    # No token, a wrong token: every verb, before any handler runs.
    verbs = {
        "ListFlights": criteria(b""),
        "GetFlightInfo": path_descriptor("topics", public),
        "GetSchema": path_descriptor("topics", public),
        "DoGet": ticket(json_ticket(topic=public)),
        "DoAction": action("health"),
        "ListActions": b"",
    }
    for token, needle in ((None, "required"), ("not-a-real-token-at-all", "not valid")):
        for method, request in verbs.items():
            out = call(target, method, request, token)
            expect(f"{method} token={token}", out, UNAUTHENTICATED, needle)
        put = [
            flight_data(*ipc_parts(pa.schema([("value", pa.binary())])), path=["topics", public])
        ]
        expect(f"DoPut token={token}", call(target, "DoPut", put, token), UNAUTHENTICATED, needle)

    # Bad tickets: as do_get tickets and as get_flight_info / get_schema commands.
    for name, (body, needle) in ticket_refusals(public, secret).items():
        expect(f"DoGet {name}", call(target, "DoGet", ticket(body)), INVALID, needle)
        for method in ("GetFlightInfo", "GetSchema"):
            out = call(target, method, command_descriptor(body))
            expect(f"{method} {name}", out, INVALID, needle)

    # Bad descriptor paths.
    for method in ("GetFlightInfo", "GetSchema"):
        for parts, needle in (
            (("topics", "no-such-topic"), "unknown topic"),
            (("topics", secret), f"unknown topic '{secret}'"),
            (("tables", public), "unknown descriptor path"),
            (("topics",), "unknown descriptor path"),
            (("topics", ""), "unknown descriptor path"),
        ):
            out = call(target, method, path_descriptor(*parts))
            expect(f"{method} path {parts}", out, INVALID, needle)

    # Actions.
    for name, request, needle in (
        ("unknown action", action("drop-everything"), "unknown action 'drop-everything'"),
        ("no body", action("describe-topic"), "describe-topic takes"),
        ("body not json", action("describe-topic", b"{nope"), "describe-topic takes"),
        ("topic not a string", action("describe-topic", b'{"topic": [1]}'), "takes"),
        ("deep body", action("describe-topic", b"[" * 100_000 + b"]" * 100_000), "takes"),
        ("oversize body", action("describe-topic", b" " * (2 << 20)), "describe-topic takes"),
        ("unknown topic", action("describe-topic", b'{"topic": "nope"}'), "unknown topic"),
        ("forbidden topic", action("describe-topic", json_ticket(topic=secret)), "unknown topic"),
    ):
        expect(f"DoAction {name}", call(target, "DoAction", request), INVALID, needle)

    # Puts.
    value_schema = pa.schema([("value", pa.binary())])
    header, _ = ipc_parts(value_schema)
    big = pa.record_batch([pa.array([b"x" * 8192])], schema=value_schema)
    for name, messages, token, code, needle in (
        ("forbidden write", [flight_data(header, path=["topics", public])], READER, DENIED, ""),
        (
            "not a path",
            [flight_data(header, path=["tables", public])],
            WRITER,
            INVALID,
            "unknown descriptor path",
        ),
        (
            "no value column",
            [flight_data(*ipc_parts(pa.schema([("value", pa.int8())])), path=["topics", public])],
            WRITER,
            INVALID,
            "must be binary or string",
        ),
        (
            "oversize batch",
            [flight_data(header, path=["topics", public]), flight_data(*ipc_parts(big))],
            WRITER,
            INVALID,
            "max_batch_bytes",
        ),
        (
            "truncated body",
            [
                flight_data(header, path=["topics", public]),
                flight_data(ipc_parts(big)[0], ipc_parts(big)[1][:16]),
            ],
            WRITER,
            INVALID,
            "0 rows were produced",
        ),
    ):
        out = call(target, "DoPut", messages, token)
        expect(f"DoPut {name}", out, code, needle or " ")

    # Verbs the gateway does not serve.
    exchange = [flight_data(header, path=["topics", public])]
    out = call(target, "DoExchange", exchange)
    expect("DoExchange", out, UNIMPLEMENTED, "do_exchange is not served")
    # Basic sign-in (Flight's handshake) with wrong or malformed credentials.
    for credential, needle in (
        (base64.b64encode(b"ana:wrong").decode(), "wrong user name or password"),
        (base64.b64encode(b"nobody:a-password").decode(), "wrong user name or password"),
        ("%%%not-base64", "malformed basic credentials"),
    ):
        out = call(target, "Handshake", [b""], f"Basic {credential}")
        expect(f"Handshake {credential}", out, UNAUTHENTICATED, needle)

    # A fault inside the gateway: logged there, told as INTERNAL with an incident id and
    # nothing of the exception (whose text names a file on the gateway).
    catalog = gw.gateway.catalog
    leaky = OSError(2, "No such file or directory", f"{SERVER_ROOT}/lane/x.parquet")

    def broken(*args: object, **kwargs: object) -> object:
        raise leaky

    catalog.describe = broken  # type: ignore[method-assign]
    catalog.reader.read_pairs = broken  # type: ignore[method-assign]
    try:
        out = call(target, "DoAction", action("describe-topic", json_ticket(topic=public)))
        expect("DoAction internal fault", out, INTERNAL, "incident")
        out = call(target, "DoGet", ticket(json_ticket(topic=public)))
        expect("DoGet internal fault mid-stream", out, INTERNAL, "incident")
    finally:
        del catalog.describe, catalog.reader.read_pairs

    # The per-caller stream limit (1 here): a second stream while a follow stream is open.
    with grpc.insecure_channel(target) as channel:
        follow = channel.unary_stream(SERVICE + "DoGet", lambda b: b, lambda b: b)(
            ticket(json_ticket(topic=public, lane="raw", end="follow")),
            metadata=[("authorization", f"Bearer {READER}")],
            timeout=20,
        )
        next(follow)  # the schema: the stream holds its slot
        out = call(target, "DoGet", ticket(json_ticket(topic=public)))
        expect("DoGet over the stream limit", out, UNAVAILABLE, "too many open streams")
        follow.cancel()

    assert len(seen) > 80, sorted(seen)


def test_pyarrow_clients_read_the_message(gateway: tuple[RunningGateway, str, str]) -> None:
    """What a pyarrow client gets: the exception class of the status, and the message."""
    gw, public, _ = gateway
    client = fl.FlightClient(gw.flight_url)
    options = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {READER}".encode())])
    bad = json_ticket(topic=public, start={"offset": 9}, end={"offset": 1})
    for make in (
        lambda: client.do_get(fl.Ticket(bad), options=options).read_all(),
        lambda: client.get_flight_info(fl.FlightDescriptor.for_command(bad), options=options),
        lambda: client.get_schema(fl.FlightDescriptor.for_command(bad), options=options),
    ):
        with pytest.raises(pa.ArrowInvalid) as refused:
            make()
        message = str(refused.value)
        assert message.startswith("invalid ticket: start {offset: 9} is after end {offset: 1}")
        assert "Traceback" not in message and ".py" not in message


def test_an_end_beyond_the_partition_is_answered_up_to_it(
    gateway: tuple[RunningGateway, str, str],
) -> None:
    """A bounded read whose end is past what the partition holds ends at once with what
    there is (it does not wait for records that may never come), as do its endpoints."""
    gw, public, _ = gateway
    client = fl.FlightClient(gw.flight_url)
    options = fl.FlightCallOptions(
        headers=[(b"authorization", f"Bearer {READER}".encode())], timeout=10
    )
    far = json_ticket(topic=public, lane="raw", end={"offset": 1_000_000})
    table = client.do_get(fl.Ticket(far), options=options).read_all()
    assert table.num_rows == 3
    info = client.get_flight_info(fl.FlightDescriptor.for_command(far), options=options)
    ends = [json.loads(e.app_metadata)["end"] for e in info.endpoints]
    assert ends == [3]
    beyond = json_ticket(topic=public, lane="raw", start={"offset": 50}, end={"offset": 60})
    assert client.do_get(fl.Ticket(beyond), options=options).read_all().num_rows == 0
    info = client.get_flight_info(fl.FlightDescriptor.for_command(beyond), options=options)
    assert [
        client.do_get(e.ticket, options=options).read_all().num_rows for e in info.endpoints
    ] == [0]
