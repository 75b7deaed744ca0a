"""A secured Kafka cluster, as clusters are deployed: TLS, SASL PLAIN and SCRAM-SHA-256/512,
client certificates, OAUTHBEARER tokens (a file, an OIDC endpoint, MSK IAM) — and every
way a login can be refused, named, survived and retried slowly.

The cluster is tansu behind ``tests.sasl_front`` (a TLS + SASL terminating front, why in
its docstring); confluent-kafka is the independent client the test produces and reads
with, so the gateway's clients are checked against another implementation, not against
themselves.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import thalweg_client
from tests.conftest import RunningGateway, source_cfg
from tests.helpers import consume_confluent, wait_until
from tests.registry_server import FakeRegistry
from tests.sasl_front import SaslFront, Tls
from tests.tls_certs import Pki, make_pki
from thalweg.config.models import KafkaSourceConfig
from thalweg.embedded import free_port
from thalweg.embedded.tansu import TansuBroker
from thalweg.errors import LoginRefusedError, SourceError
from thalweg.kafka.login import check_login

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery staple"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass
class Cluster:
    """tansu behind a TLS + SASL front; ``tokens`` are the bearer tokens it accepts."""

    front: SaslFront
    broker: TansuBroker
    pki: Pki
    tokens: set[str]

    @property
    def bootstrap(self) -> str:
        return self.front.bootstrap

    def client_config(self, mechanism: str = "SCRAM-SHA-512") -> dict[str, Any]:
        """confluent-kafka settings of a well-behaved client of this cluster."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism,
            "sasl.username": "svc",
            "sasl.password": PASSWORD,
            "ssl.ca.location": str(self.pki.ca),
            "log_level": 2,
        }

    def topic(self, prefix: str) -> str:
        """A new topic, and its dead-letter topic ``<name>-dlq`` (see :meth:`source`)."""
        name = f"{prefix}-{secrets.token_hex(5)}"
        admin = AdminClient(self.client_config())
        made = admin.create_topics([NewTopic(t, 1, 1) for t in (name, f"{name}-dlq")])
        for future in made.values():
            future.result(15)
        return name

    def produce(self, topic: str, values: list[bytes]) -> None:
        p = Producer({**self.client_config(), "linger.ms": 5})
        for v in values:
            p.produce(topic, v, partition=0)
        assert p.flush(15) == 0

    def read(self, topic: str, n: int) -> list[bytes | None]:
        cfg = {k.replace(".", "_"): v for k, v in self.client_config().items()}
        del cfg["bootstrap_servers"], cfg["log_level"]
        return [r.value for r in consume_confluent(self.bootstrap, topic, n, **cfg)]

    def source(self, name: str, topic: str, mechanism: str, **extra: Any) -> dict[str, Any]:
        """A gateway source table logging in with ``mechanism``."""
        cfg = source_cfg(
            self.bootstrap,
            [topic],
            name=name,
            security_protocol="SASL_SSL",
            sasl_mechanism=mechanism,
            ssl_cafile=str(self.pki.ca),
            format="json",
            dlq_topic=f"{topic}-dlq",
        )
        if mechanism != "OAUTHBEARER":
            cfg |= {"sasl_username": "svc", "sasl_password": PASSWORD}
        return cfg | extra


def _tansu_behind(front_port: int, tmp: Path) -> TansuBroker:
    return TansuBroker(advertised_port=front_port, log_file=tmp / "tansu.log").start()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    d = tmp_path_factory.mktemp("secured")
    pki = make_pki(d / "pki")
    tokens: set[str] = set()
    port = free_port()
    broker = _tansu_behind(port, d)
    front = SaslFront(
        broker.port,
        port=port,
        tls=Tls(pki.server_cert, pki.server_key),
        mechanisms=(*MECHANISMS, "OAUTHBEARER"),
        users={"svc": PASSWORD},
        token_ok=lambda t: t in tokens or _msk_token_ok(t),
    ).start()
    try:
        yield Cluster(front, broker, pki, tokens)
    finally:
        front.stop()
        broker.stop()


def _json(i: int) -> bytes:
    return json.dumps({"id": i, "name": f"n{i}"}).encode()


def test_every_client_logs_in_with_plain_and_both_scram_mechanisms(
    cluster: Cluster, gateway_factory: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    """One source per mechanism: its consumer, its do_put producer and its dead-letter
    topic producer all log in over TLS; the Avro source's registry is https with the
    cluster's private CA."""
    topics = {m: cluster.topic(m.lower()) for m in MECHANISMS}
    for t in topics.values():
        cluster.produce(t, [_json(i) for i in range(20)] + [b"{not json"])
    registry = FakeRegistry(tls=(str(cluster.pki.server_cert), str(cluster.pki.server_key)))
    try:
        sources = [cluster.source(f"s{i}", t, m) for i, (m, t) in enumerate(topics.items())]
        # The SCRAM-SHA-512 source decodes Avro through the https registry.
        avro_topic = topics["SCRAM-SHA-512"]
        schema = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}
        sid = registry.add(f"{avro_topic}-value", schema)
        sources[2] |= {
            "format": "avro",
            "registry": {"url": registry.url, "ssl_cafile": str(cluster.pki.ca)},
        }
        cluster.produce(avro_topic, [_avro(sid, schema, {"id": 7})])
        gw = gateway_factory([], sources=sources)
        for t in topics.values():
            want = 22 if t == avro_topic else 21
            gw.wait_durable(t, {0: want}, timeout=60)
        with thalweg_client.connect(gw.flight_url) as client:
            for t in topics.values():
                client.write(t, pa.table({"value": [_json(100 + i) for i in range(5)]}))
            for t in topics.values():
                gw.wait_durable(t, {0: (22 if t == avro_topic else 21) + 5}, timeout=60)
            decoded = client.read(avro_topic).to_pylist()
        assert any(r.get("id") == 7 for r in decoded)
        assert registry.requests, "the registry was asked over https"
        for m, t in topics.items():
            # The poison record went to the dead-letter topic through the same login.
            dead = cluster.read(f"{t}-dlq", 1)
            assert len(dead) >= 1, m
            # The put rows are on the broker, read back by another client.
            on_broker = cluster.read(t, 27 if t == avro_topic else 26)
            assert on_broker[-5:] == [_json(100 + i) for i in range(5)], m
    finally:
        registry.stop()
    counts = cluster.front.counts
    assert counts.refused == 0, counts.reasons
    assert counts.accepted >= 9  # three sources x consumer, put, dead letters


def _avro(sid: int, schema: dict[str, Any], rec: dict[str, Any]) -> bytes:
    from tests.integration.test_avro_topic import framed

    return framed(sid, schema, rec)


def test_a_broker_that_requires_client_certificates(
    cluster: Cluster, gateway_factory: Callable[..., RunningGateway], tmp_path: Path
) -> None:
    """Mutual TLS: the client certificate with a password-protected key gets in; without
    a certificate the login is refused with a TLS error that says what to set."""
    locked = tmp_path / "client.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(cluster.pki.client_key), "-out", str(locked),
         "-aes256", "-passout", "pass:key-pw"],
        check=True, capture_output=True,
    )  # fmt: skip
    topic = f"mtls-{secrets.token_hex(5)}"
    port = free_port()
    broker = _tansu_behind(port, tmp_path)
    front = SaslFront(
        broker.port,
        port=port,
        tls=Tls(cluster.pki.server_cert, cluster.pki.server_key, client_ca=cluster.pki.ca),
        mechanisms=(),
    ).start()
    try:
        base = {
            "security_protocol": "SSL",
            "ssl_cafile": str(cluster.pki.ca),
            "ssl_certfile": str(cluster.pki.client_cert),
            "ssl_keyfile": str(locked),
            "ssl_key_password": "key-pw",
        }
        with_cert = {
            "bootstrap.servers": front.bootstrap,
            "security.protocol": "SSL",
            "ssl.ca.location": str(cluster.pki.ca),
            "ssl.certificate.location": str(cluster.pki.client_cert),
            "ssl.key.location": str(cluster.pki.client_key),
            "log_level": 2,
        }
        admin = AdminClient(with_cert)  # kept: a collected client cancels its futures
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
        p = Producer(with_cert)
        for i in range(10):
            p.produce(topic, _json(i), partition=0)
        assert p.flush(15) == 0
        gw = gateway_factory([], sources=[source_cfg(front.bootstrap, [topic], **base)])
        gw.wait_durable(topic, {0: 10}, timeout=60)

        anonymous = KafkaSourceConfig(
            name="anon", bootstrap_servers=front.bootstrap, topics=[topic],
            security_protocol="SSL", ssl_cafile=cluster.pki.ca,
        )  # fmt: skip
        with pytest.raises(LoginRefusedError, match=r"TLS failed.*ssl_certfile"):
            _run(check_login(anonymous))
        wrong_pw = KafkaSourceConfig(
            name="w", bootstrap_servers=front.bootstrap, topics=[topic],
            **{**base, "ssl_key_password": "not-it"},
        )  # fmt: skip
        from thalweg.errors import ConfigError

        with pytest.raises(ConfigError, match="ssl_key_password"):
            _run(check_login(wrong_pw))
    finally:
        front.stop()
        broker.stop()


def _run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


# -- OAUTHBEARER --------------------------------------------------------------------------

MSK_KEY = "AKIATHALWEGTESTKEY01"


def _msk_token_ok(token: str) -> bool:
    """An MSK IAM token: a base64url SigV4-presigned ``kafka-cluster:Connect`` URL signed
    with the test's access key (what MSK's broker checks, short of the signature)."""
    try:
        url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except ValueError:
        return False
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    return (
        query.get("Action") == ["kafka-cluster:Connect"]
        and query.get("X-Amz-Credential", [""])[0].startswith(MSK_KEY + "/")
        and bool(query.get("X-Amz-Signature"))
    )


class OidcStub:
    """A client-credentials token endpoint: issues tokens the cluster accepts to the one
    client whose secret is right, 401 to anyone else."""

    def __init__(self, accepted: set[str], client: str, secret: str) -> None:
        stub = self
        self.issued = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                """Quiet: the test reads ``issued``."""

            def do_POST(self) -> None:
                form = urllib.parse.parse_qs(
                    self.rfile.read(int(self.headers["Content-Length"])).decode()
                )
                want = "Basic " + base64.b64encode(f"{client}:{secret}".encode()).decode()
                if self.headers.get("Authorization") != want or form.get("grant_type") != [
                    "client_credentials"
                ]:
                    self._reply(401, {"error": "invalid_client"})
                    return
                token = secrets.token_urlsafe(24)
                accepted.add(token)
                stub.issued += 1
                self._reply(200, {"access_token": token, "token_type": "Bearer", "expires_in": 300})

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}/token"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_oauthbearer_with_a_token_file_an_oidc_endpoint_and_msk_iam(
    cluster: Cluster,
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", MSK_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "thalweg-test-secret")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    token_file = tmp_path / "token"
    file_token = secrets.token_urlsafe(24)
    cluster.tokens.add(file_token)
    token_file.write_text(file_token + "\n")
    oidc = OidcStub(cluster.tokens, "thalweg", "client-secret")
    try:
        providers = {
            "file": {"token_file": str(token_file)},
            "oidc": {
                "token_url": oidc.url,
                "client_id": "thalweg",
                "client_secret": "client-secret",
            },
            "msk": {"aws_region": "eu-west-1"},
        }
        topics = {name: cluster.topic(f"oauth-{name}") for name in providers}
        for t in topics.values():
            cluster.produce(t, [_json(i) for i in range(10)])
        gw = gateway_factory(
            [],
            sources=[
                cluster.source(f"o{name}", topics[name], "OAUTHBEARER", sasl_oauth=providers[name])
                for name in providers
            ],
        )
        for t in topics.values():
            gw.wait_durable(t, {0: 10}, timeout=60)
        assert 1 <= oidc.issued <= 4, "tokens are kept for their lifetime, not fetched per login"

        # A wrong client secret: the endpoint's refusal, named.
        bad = KafkaSourceConfig(
            name="b", bootstrap_servers=cluster.bootstrap, topics=["x"],
            security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", ssl_cafile=cluster.pki.ca,
            sasl_oauth={"token_url": oidc.url, "client_id": "thalweg", "client_secret": "nope"},
        )  # fmt: skip
        with pytest.raises(LoginRefusedError, match=r"OIDC token endpoint refused.*401"):
            _run(check_login(bad))
    finally:
        oidc.stop()


# -- refusals -----------------------------------------------------------------------------


def _secured(bootstrap: str, pki: Pki, mechanism: str, **kw: Any) -> KafkaSourceConfig:
    base: dict[str, Any] = {
        "name": "r",
        "bootstrap_servers": bootstrap,
        "topics": ["x"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": mechanism,
        "ssl_cafile": pki.ca,
    }
    if mechanism != "OAUTHBEARER":
        base |= {"sasl_username": "svc", "sasl_password": PASSWORD}
    return KafkaSourceConfig(**(base | kw))


def test_every_form_of_refused_login_is_a_typed_error_naming_the_cause(
    cluster: Cluster, tmp_path: Path
) -> None:
    rfc = SaslFront(
        cluster.broker.port,
        tls=Tls(cluster.pki.server_cert, cluster.pki.server_key),
        mechanisms=("PLAIN", "SCRAM-SHA-512"),
        users={"svc": PASSWORD},
        refuse="scram-e",
    ).start()
    try:
        cases: list[tuple[KafkaSourceConfig, str]] = [
            # Apache Kafka's answer: SaslAuthenticate error 58 with a message.
            (
                _secured(cluster.bootstrap, cluster.pki, "SCRAM-SHA-256", sasl_password="wrong"),
                "authentication failed .*SCRAM-SHA-256 as 'svc'.*refused the credentials"
                ".*sasl_password",
            ),
            (
                _secured(cluster.bootstrap, cluster.pki, "PLAIN", sasl_username="nobody"),
                "authentication failed .*PLAIN as 'nobody'",
            ),
            # RFC 5802's and tansu's answer: a server-final "e=…" (aiokafka: KeyError 'v').
            (
                _secured(rfc.bootstrap, cluster.pki, "SCRAM-SHA-512", sasl_password="wrong"),
                "authentication failed .*SCRAM exchange without accepting it",
            ),
            (
                _secured(rfc.bootstrap, cluster.pki, "SCRAM-SHA-512", sasl_username="nobody"),
                "authentication failed .*SCRAM",
            ),
            # A mechanism the broker does not enable.
            (
                _secured(rfc.bootstrap, cluster.pki, "SCRAM-SHA-256"),
                "authentication failed .*check sasl_mechanism",
            ),
            # A token the broker does not accept.
            (
                _secured(
                    cluster.bootstrap,
                    cluster.pki,
                    "OAUTHBEARER",
                    sasl_oauth={"token_file": str(_write(tmp_path / "t", "not-a-token"))},
                ),
                "authentication failed .*OAUTHBEARER, token from file",
            ),
            # The broker's certificate signed by a CA the client does not trust.
            (
                _secured(cluster.bootstrap, cluster.pki, "PLAIN", ssl_cafile=cluster.pki.other_ca),
                "TLS failed .*not trusted.*check ssl_cafile",
            ),
        ]
        for cfg, want in cases:
            with pytest.raises(LoginRefusedError, match=want):
                _run(check_login(cfg))
        # Nobody listening is not a refused login: a plain, quickly retried source error.
        nobody = _secured(f"127.0.0.1:{free_port()}", cluster.pki, "PLAIN")
        with pytest.raises(SourceError, match="cannot connect") as info:
            _run(check_login(nobody))
        assert not isinstance(info.value, LoginRefusedError)
    finally:
        rfc.stop()


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_wrong_password_leaves_the_gateway_up_named_and_retrying_slowly(
    cluster: Cluster,
    gateway_factory: Callable[..., RunningGateway],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """tansu's own refusal form (``e=…``) killed ``twg stream`` with ``KeyError: 'v'``;
    a wrong password was retried 168 times in 40 s. Now: alive, /health and the log say
    authentication, /ready is 503, and the logins back off."""
    rfc = SaslFront(
        cluster.broker.port,
        tls=Tls(cluster.pki.server_cert, cluster.pki.server_key),
        mechanisms=("SCRAM-SHA-512",),
        users={"svc": PASSWORD},
        refuse="scram-e",
    ).start()
    try:
        topic = cluster.topic("refused")
        gw = gateway_factory(
            [],
            sources=[
                cluster.source("locked", topic, "SCRAM-SHA-512", sasl_password="wrong")
                | {"bootstrap_servers": rfc.bootstrap}
            ],
        )
        window_s = 12.0
        started = time.monotonic()
        wait_until(lambda: rfc.counts.attempts >= 1, 20, "a first login")
        time.sleep(max(0.0, window_s - (time.monotonic() - started)))
        gw.raise_errors()  # alive: no error escaped the gateway
        assert gw._thread.is_alive()
        health = _get(gw.admin_url + "/health")
        assert health[0] == 200 or health[0] == 503
        assert "authentication failed" in health[1] and "sasl_password" in health[1]
        assert _get(gw.admin_url + "/ready")[0] == 503
        assert _get(gw.admin_url + "/live")[0] == 200
        # Bounded: the waits are 0.5-5 s, then 1-10 s, 2-20 s ... (full jitter), so at
        # most 5 logins fit in 12 s; the connect backoff (0.2 s doubling to 5 s) fits 7
        # or more, and the gateway before this made 168 in 40 s.
        assert 1 <= rfc.counts.attempts <= 5, rfc.counts
        named = [r for r in caplog.records if "authentication failed" in r.getMessage()]
        assert named and all(r.exc_info is None for r in named)
        # A put through the same refused login says so (it was a KeyError from aiokafka).
        with (
            thalweg_client.connect(gw.flight_url) as client,
            pytest.raises(pa.ArrowException, match="authentication failed"),
        ):
            client.write(topic, pa.table({"value": [b"{}"]}))
        gw.raise_errors()
    finally:
        rfc.stop()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
