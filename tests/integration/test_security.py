"""Bearer tokens and per-topic permissions on every Flight verb; no topic name leaks."""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import READER, TOKENS, WRITER

pytestmark = pytest.mark.integration


def calls(
    client: fl.FlightClient, topic: str, options: fl.FlightCallOptions
) -> dict[str, Callable[[], object]]:
    """One call per verb against ``topic``."""
    ticket = fl.Ticket(json.dumps({"topic": topic}).encode())
    desc = fl.FlightDescriptor.for_path("topics", topic)

    def put() -> None:
        table = pa.table({"value": [b"x"]})
        writer, _ = client.do_put(desc, table.schema, options=options)
        writer.write_table(table)
        writer.close()

    return {
        "list_flights": lambda: list(client.list_flights(options=options)),
        "get_flight_info": lambda: client.get_flight_info(desc, options=options),
        "get_schema": lambda: client.get_schema(desc, options=options),
        "do_get": lambda: client.do_get(ticket, options=options).read_all(),
        "do_put": put,
        "describe-topic": lambda: list(
            client.do_action(
                fl.Action("describe-topic", json.dumps({"topic": topic}).encode()), options=options
            )
        ),
        "list_actions": lambda: client.list_actions(options=options),
    }


def test_security_matrix(
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    public, secret = topic_factory(1, prefix="pub"), topic_factory(1, prefix="sec")
    for t in (public, secret):
        producer.produce(t, b'{"a": 1}', partition=0)
    producer.flush(10)
    gw = gateway_factory(
        [public, secret],
        gateway={"auth": {"tokens": TOKENS}},
    )
    gw.wait_durable(public, {0: 1})
    gw.wait_durable(secret, {0: 1})
    client = fl.FlightClient(gw.flight_url)
    none = fl.FlightCallOptions()
    bad = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer not-a-real-token-at-all")])
    reader = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {READER}".encode())])

    # No token, or a wrong one: nothing at all is served, for every verb.
    for options in (none, bad):
        for verb, call in calls(client, public, options).items():
            # pyarrow raises do_get's refusal at read time as a plain OSError.
            with pytest.raises((fl.FlightUnauthenticatedError, OSError)) as refused:
                call()
            assert "Unauthenticated" in str(refused.value), verb
            assert "bearer token" in str(refused.value), verb

    # A reader sees its topics only; a forbidden topic looks exactly like a missing one.
    visible = [f.descriptor.path[1].decode() for f in client.list_flights(options=reader)]
    assert visible == [public]
    for verb, call in calls(client, secret, reader).items():
        if verb in ("list_flights", "list_actions"):
            continue
        if verb == "do_put":
            with pytest.raises(fl.FlightUnauthorizedError, match="not allowed to write"):
                call()
            continue
        with pytest.raises(pa.ArrowInvalid) as forbidden:
            call()
        assert f"unknown topic '{secret}'" in str(forbidden.value)
    with pytest.raises(pa.ArrowInvalid) as missing:
        calls(client, "no-such-topic", reader)["do_get"]()
    assert (
        str(missing.value).split(". Detail")[0].replace("no-such-topic", secret)
        == str(forbidden.value).split(". Detail")[0]
    )
    # ...and may not write even to what it reads.
    with pytest.raises(fl.FlightUnauthorizedError):
        calls(client, public, reader)["do_put"]()

    # The allowed paths work, through the client library too.
    with thalweg_client.connect(gw.flight_url, token=READER) as c:
        assert c.read(public).num_rows == 1
    with thalweg_client.connect(gw.flight_url, token=WRITER) as c:
        assert c.write(secret, pa.table({"value": [b'{"a": 2}']}))[0]["rows"] == 1
        assert sorted(c.topics()) == sorted([public, secret])
