"""TLS, mutual TLS and basic-auth sign-in on the Flight server."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow.flight as fl
import pytest
from confluent_kafka import Producer

import thalweg_client
from tests.conftest import RunningGateway
from tests.tls_certs import Pki, make_pki

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def seeded(topic_factory: Callable[..., str], producer: Producer) -> str:
    topic = topic_factory(1)
    for i in range(10):
        producer.produce(topic, json.dumps({"i": i}).encode(), partition=0)
    producer.flush(10)
    return topic


def _refused(call: Callable[[], object]) -> None:
    # A failed TLS handshake surfaces as UNAVAILABLE (FlightUnavailableError) or, from
    # some code paths, as a plain OSError; either way no RPC was served.
    with pytest.raises((fl.FlightUnavailableError, fl.FlightError, OSError)):
        call()


def tls_gateway(
    factory: Callable[..., RunningGateway], pki: Pki, topic: str, **tls: str
) -> RunningGateway:
    """A gateway serving Flight over TLS with the test PKI's server certificate."""
    gw = factory(
        [topic],
        gateway={
            "flight_listen": "grpc+tls://127.0.0.1:0",
            "tls": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), **tls},
        },
    )
    gw.wait_durable(topic, {0: 10})
    return gw


def test_tls_server_refuses_plaintext_and_untrusted_clients(
    pki: Pki, seeded: str, gateway_factory: Callable[..., RunningGateway]
) -> None:
    gw = tls_gateway(gateway_factory, pki, seeded)
    url = gw.flight_url
    assert url.startswith("grpc+tls://127.0.0.1:")
    with thalweg_client.connect(url, tls_root_certs=pki.pem("ca")) as client:
        assert client.read(seeded).num_rows == 10
    plain = fl.FlightClient(url.replace("grpc+tls://", "grpc://"))
    _refused(lambda: list(plain.list_flights()))
    untrusted = fl.FlightClient(url, tls_root_certs=pki.pem("other_ca"))
    _refused(lambda: list(untrusted.list_flights()))


def test_mutual_tls_needs_a_client_certificate(
    pki: Pki, seeded: str, gateway_factory: Callable[..., RunningGateway]
) -> None:
    gw = tls_gateway(gateway_factory, pki, seeded, client_ca_file=str(pki.ca))
    url = gw.flight_url
    no_cert = fl.FlightClient(url, tls_root_certs=pki.pem("ca"))
    _refused(lambda: list(no_cert.list_flights()))
    with thalweg_client.connect(
        url,
        tls_root_certs=pki.pem("ca"),
        cert_chain=pki.pem("client_cert"),
        private_key=pki.pem("client_key"),
    ) as client:
        assert client.read(seeded).num_rows == 10


def test_basic_auth_sign_in_issues_a_session_token(
    tmp_path: Path, seeded: str, gateway_factory: Callable[..., RunningGateway]
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("correct horse battery\n")
    gw = gateway_factory(
        [seeded],
        gateway={
            "auth": {
                "users": [{"name": "ana", "password_file": str(secret), "read": [seeded]}],
                "session_ttl_s": 60,
            }
        },
    )
    gw.wait_durable(seeded, {0: 10})
    with thalweg_client.connect(
        gw.flight_url, username="ana", password="correct horse battery"
    ) as client:
        assert client.read(seeded).num_rows == 10
        # What came back is a session token, not the password.
        ((name, value),) = client.call_headers
        assert name == b"authorization"
        assert value.startswith(b"Bearer ")
        assert b"correct horse" not in value
        with pytest.raises(fl.FlightUnauthorizedError):
            client.write(seeded, __import__("pyarrow").table({"value": [b"x"]}))
    for user, password in (("ana", "wrong password"), ("bob", "correct horse battery")):
        with pytest.raises(fl.FlightUnauthenticatedError, match="wrong user name or password"):
            thalweg_client.connect(gw.flight_url, username=user, password=password)
    stale = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer not-a-session-token")])
    with pytest.raises(fl.FlightUnauthenticatedError):
        list(fl.FlightClient(gw.flight_url).list_flights(options=stale))
