"""The settings every aiokafka client of a Kafka source's cluster is built with.

The consumer, the ``do_put`` producer and the dead-letter topic producer all talk to the
same cluster, so they must all speak its security protocol: one function builds the
aiokafka arguments (TLS context, SASL mechanism and credentials) for all three. Before it
existed the producers connected in plaintext, which a SASL or TLS cluster refuses.
"""

from __future__ import annotations

import ssl
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from thalweg.config.models import KafkaSourceConfig
from thalweg.errors import ConfigError
from thalweg.kafka.tokens import token_provider


def security_kwargs(cfg: KafkaSourceConfig) -> dict[str, Any]:
    """aiokafka client arguments for ``cfg``'s security protocol (consumer or producer)."""
    kw: dict[str, Any] = {"security_protocol": cfg.security_protocol}
    if cfg.security_protocol in ("SSL", "SASL_SSL"):
        kw["ssl_context"] = tls_context(cfg)
    if cfg.sasl_mechanism == "OAUTHBEARER" and cfg.sasl_oauth is not None:
        kw["sasl_mechanism"] = cfg.sasl_mechanism
        kw["sasl_oauth_token_provider"] = token_provider(cfg.sasl_oauth)
    elif cfg.sasl_mechanism:
        kw["sasl_mechanism"] = cfg.sasl_mechanism
        kw["sasl_plain_username"] = cfg.sasl_username
        kw["sasl_plain_password"] = (
            cfg.sasl_password.get_secret_value() if cfg.sasl_password else None
        )
    return kw


def tls_context(cfg: KafkaSourceConfig) -> ssl.SSLContext:
    """The client's TLS context: the brokers' CA (the system's by default) and, for
    brokers that require mutual TLS, the client certificate and its key.

    A file that cannot be read or a key that does not open is a configuration error at
    start (``LoginRefusedError`` would retry what can never work).
    """
    try:
        ctx = ssl.create_default_context(cafile=str(cfg.ssl_cafile) if cfg.ssl_cafile else None)
        if cfg.ssl_certfile is not None:
            ctx.load_cert_chain(
                str(cfg.ssl_certfile),
                str(cfg.ssl_keyfile) if cfg.ssl_keyfile else None,
                password=cfg.ssl_key_password.get_secret_value() if cfg.ssl_key_password else None,
            )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"source {cfg.name!r}: TLS files (ssl_cafile, ssl_certfile, ssl_keyfile, "
            f"ssl_key_password) do not load: {exc}"
        ) from exc
    return ctx


def consumer_kwargs(cfg: KafkaSourceConfig) -> dict[str, Any]:
    """The consumer-group member's arguments. Auto-commit is always off: the engine
    commits a position only after the raw lane covering it is durable."""
    return {
        "bootstrap_servers": cfg.bootstrap_servers,
        "group_id": cfg.group_id,
        "group_instance_id": cfg.group_instance_id,
        "client_id": f"thalweg-{cfg.name}",
        "enable_auto_commit": False,
        "auto_offset_reset": cfg.auto_offset_reset,
        "isolation_level": cfg.isolation_level,
        "session_timeout_ms": cfg.session_timeout_ms,
        "heartbeat_interval_ms": cfg.heartbeat_interval_ms,
        "request_timeout_ms": cfg.request_timeout_ms,
        "fetch_max_bytes": cfg.fetch_max_bytes,
        "max_partition_fetch_bytes": cfg.max_partition_fetch_bytes,
        "fetch_max_wait_ms": cfg.fetch_max_wait_ms,
        "metadata_max_age_ms": cfg.metadata_max_age_ms,
        **security_kwargs(cfg),
    }


def new_consumer(
    cfg: KafkaSourceConfig, assignors: tuple[Any, ...] = (), **extra: Any
) -> AIOKafkaConsumer:
    """A (not started) consumer for ``cfg``; call on the event loop that will run it.

    ``assignors`` are the group protocols announced, preferred first (aiokafka's
    round-robin when empty); ``extra`` are further aiokafka arguments.
    """
    kw = {**consumer_kwargs(cfg), **extra}
    if assignors:
        kw["partition_assignment_strategy"] = assignors
    return AIOKafkaConsumer(**kw)


def new_producer(bootstrap_servers: str, **producer: Any) -> AIOKafkaProducer:
    """A plain (not started) aiokafka producer with the library's defaults, for demo data;
    the gateway's own produce path is :class:`thalweg.kafka.producer.KafkaWriter`."""
    return AIOKafkaProducer(bootstrap_servers=bootstrap_servers, **producer)
