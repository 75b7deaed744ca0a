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


def security_kwargs(cfg: KafkaSourceConfig) -> dict[str, Any]:
    """aiokafka client arguments for ``cfg``'s security protocol (consumer or producer)."""
    kw: dict[str, Any] = {"security_protocol": cfg.security_protocol}
    if cfg.security_protocol in ("SSL", "SASL_SSL"):
        kw["ssl_context"] = ssl.create_default_context(
            cafile=str(cfg.ssl_cafile) if cfg.ssl_cafile else None
        )
    if cfg.sasl_mechanism:
        kw["sasl_mechanism"] = cfg.sasl_mechanism
        kw["sasl_plain_username"] = cfg.sasl_username
        kw["sasl_plain_password"] = (
            cfg.sasl_password.get_secret_value() if cfg.sasl_password else None
        )
    return kw


def consumer_kwargs(cfg: KafkaSourceConfig) -> dict[str, Any]:
    """The consumer-group member's arguments. Auto-commit is always off: the engine
    commits a position only after the raw lane covering it is durable."""
    return {
        "bootstrap_servers": cfg.bootstrap_servers,
        "group_id": cfg.group_id,
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
