"""Every client of a Kafka source's cluster — consumer, do_put producer, dead-letter topic
producer — gets the source's TLS and SASL settings (a secured cluster refuses the rest)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from thalweg.config.models import KafkaSourceConfig
from thalweg.flight.server import GatewayFlightServer
from thalweg.kafka.clients import consumer_kwargs, security_kwargs
from thalweg.kafka.dlq import DeadLetterTopic
from thalweg.lane.catalog import LaneCatalog
from thalweg.lane.layout import LaneLayout
from thalweg.lane.live import LiveTail
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
