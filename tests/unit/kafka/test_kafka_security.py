"""Every client of a Kafka source's cluster — consumer, do_put producer, dead-letter topic
producer — gets the source's TLS and SASL settings (a secured cluster refuses the rest)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from thalweg.config.models import KafkaSourceConfig
from thalweg.errors import ConfigError, LoginRefusedError
from thalweg.flight.server import GatewayFlightServer
from thalweg.kafka.clients import consumer_kwargs, security_kwargs
from thalweg.kafka.dlq import DeadLetterTopic
from thalweg.kafka.tokens import FileToken
from thalweg.lane.layout import LaneLayout
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.lane.read.live import LiveTail
from thalweg.ops.metrics import Metrics
from thalweg.records import MetadataColumns


def secured(tmp_path: Path) -> KafkaSourceConfig:
    # A real CA file: the SSL context loads it (a missing file would fail here).
    ca = tmp_path / "ca.pem"
    ca.write_text(_self_signed(tmp_path))
    return KafkaSourceConfig(
        name="s",
        bootstrap_servers="127.0.0.1:1",
        topics=["t"],
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="svc",
        sasl_password="s3cret-password",
        ssl_cafile=ca,
    )


def _self_signed(tmp_path: Path) -> str:
    from tests.tls_certs import make_pki

    return make_pki(tmp_path / "pki").ca.read_text()


def client_settings(producer: Any) -> tuple[Any, ...]:
    c = producer.client
    return (
        c._security_protocol,
        c._sasl_mechanism,
        c._sasl_plain_username,
        c._sasl_plain_password,
        c._ssl_context is not None,
    )


WANT = ("SASL_SSL", "SCRAM-SHA-256", "svc", "s3cret-password", True)


def test_the_consumer_and_both_producers_share_the_cluster_settings(tmp_path: Path) -> None:
    cfg = secured(tmp_path)
    kw = security_kwargs(cfg)
    assert kw["security_protocol"] == "SASL_SSL" and kw["ssl_context"] is not None
    consumer_kw = consumer_kwargs(cfg)
    assert {k: consumer_kw[k] for k in kw if k != "ssl_context"} == {
        k: v for k, v in kw.items() if k != "ssl_context"
    }

    server = GatewayFlightServer(
        "grpc://127.0.0.1:0",
        LaneCatalog(LaneLayout(tmp_path / "lane"), MetadataColumns(), LiveTail()),
        Metrics(),
        sources={"t": cfg},
    )
    try:

        async def made() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            put = server.puts.producer_for(cfg)._writer._producer
            dlq = (
                DeadLetterTopic(
                    cfg.bootstrap_servers, "dlq", MetadataColumns(), **security_kwargs(cfg)
                )
                .make_writer()
                ._producer
            )
            return client_settings(put), client_settings(dlq)

        put, dlq = asyncio.run(made())
    finally:
        server.shutdown()
    assert put == WANT
    assert dlq == WANT


def test_plaintext_sources_stay_plaintext() -> None:
    cfg = KafkaSourceConfig(name="s", bootstrap_servers="127.0.0.1:1", topics=["t"])
    assert security_kwargs(cfg) == {"security_protocol": "PLAINTEXT"}


def _cfg(**kw: Any) -> KafkaSourceConfig:
    return KafkaSourceConfig(name="s", bootstrap_servers="127.0.0.1:1", topics=["t"], **kw)


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": "p"},
         "needs security_protocol SASL_SSL"),
        ({"security_protocol": "SASL_SSL"}, "needs sasl_mechanism"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512"},
         "needs sasl_username and sasl_password"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"},
         "needs a \\[sources.sasl_oauth\\] table"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
          "sasl_oauth": {"token_file": "/t", "aws_region": "eu-west-1"}}, "exactly one of"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
          "sasl_oauth": {"token_url": "https://idp/token"}}, "needs client_id and client_secret"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u",
          "sasl_password": "p", "sasl_oauth": {"token_file": "/t"}}, "only used with"),
        ({"security_protocol": "SSL", "ssl_certfile": "/c.pem"}, "go together"),
        ({"security_protocol": "SSL", "ssl_key_password": "x"}, "needs ssl_keyfile"),
        ({"ssl_cafile": "/ca.pem"}, "need security_protocol SSL or SASL_SSL"),
    ],
)  # fmt: skip
def test_security_settings_that_cannot_work_are_refused_at_load(
    settings: dict[str, Any], why: str
) -> None:
    with pytest.raises(ValidationError, match=why):
        _cfg(**settings)


def test_every_security_secret_is_listed_and_never_shown(tmp_path: Path) -> None:
    from thalweg.config import parse_config

    cfg = parse_config(
        {
            "gateway": {"data_dir": str(tmp_path)},
            "sources": [
                {
                    "name": "s", "kind": "kafka", "bootstrap_servers": "b:1", "topics": ["t"],
                    "security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
                    "ssl_certfile": "/c", "ssl_keyfile": "/k", "ssl_key_password": "kpw",
                    "sasl_oauth": {"token_url": "https://idp/t", "client_id": "c",
                                   "client_secret": "cs"},
                }
            ],
        }
    )  # fmt: skip
    assert set(cfg.secrets()) == {
        "sources.0.ssl_key_password",
        "sources.0.sasl_oauth.client_secret",
    }
    assert "kpw" not in repr(cfg) and "cs'" not in repr(cfg)


def test_oauthbearer_clients_get_the_configured_token_provider(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    cfg = _cfg(
        security_protocol="SASL_SSL",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauth={"token_file": str(token), "extensions": {"logicalCluster": "lkc-1"}},
    )
    kw = security_kwargs(cfg)
    provider = kw["sasl_oauth_token_provider"]
    assert isinstance(provider, FileToken) and "sasl_plain_password" not in kw
    assert provider.extensions() == {"logicalCluster": "lkc-1"}
    assert asyncio.run(provider.token()) == "first"
    token.write_text("rotated")  # re-read at every login
    assert asyncio.run(provider.token()) == "rotated"
    token.write_text("  \n")
    with pytest.raises(LoginRefusedError, match="is empty"):
        asyncio.run(provider.token())


def test_an_unreadable_client_key_is_a_config_error_at_start(tmp_path: Path) -> None:
    cfg = secured(tmp_path).model_copy(
        update={"ssl_certfile": tmp_path / "none.pem", "ssl_keyfile": tmp_path / "none.key"}
    )
    with pytest.raises(ConfigError, match=r"TLS files .* do not load"):
        security_kwargs(cfg)


def test_a_kafka_source_takes_topics_or_a_whole_name_pattern() -> None:
    with pytest.raises(ValidationError, match="either topics or a topics_pattern"):
        KafkaSourceConfig(name="s", bootstrap_servers="b:1")
    with pytest.raises(ValidationError, match="either topics or a topics_pattern"):
        KafkaSourceConfig(name="s", bootstrap_servers="b:1", topics=["t"], topics_pattern="t.*")
    with pytest.raises(ValidationError, match="not a regular expression"):
        KafkaSourceConfig(name="s", bootstrap_servers="b:1", topics_pattern="orders[")
    cfg = KafkaSourceConfig(name="s", bootstrap_servers="b:1", topics_pattern="orders-[a-z]+")
    assert cfg.takes("orders-eu") and not cfg.takes("orders-eu-2") and not cfg.takes("x-orders-eu")


def test_every_key_of_a_broker_source_is_in_the_configuration_reference() -> None:
    """docs/configuration.md names every key of a Kafka or Pulsar source and of its
    sasl_oauth table (a key added without its line fails here)."""
    from thalweg.config.kafka_security import SaslOAuthConfig
    from thalweg.config.models import PulsarSourceConfig

    doc = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    for model in (KafkaSourceConfig, SaslOAuthConfig, PulsarSourceConfig):
        missing = [f for f in model.model_fields if f"`{f}`" not in doc]
        assert not missing, f"{model.__name__}: {missing}"
