"""Pulsar clients and subscriptions, built one way for every user.

The client is blocking C++ underneath: everything here runs on a worker thread
(``asyncio.to_thread``) in the callers. Its log goes to the console, never to a Python
logger: the client's I/O threads calling into Python while the interpreter exits abort
the process ("terminate called without an active exception", seen on SIGTERM during
start-up).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pulsar

from thalweg.config.models import PulsarSourceConfig

CONSUMER_TYPES = {
    "exclusive": pulsar.ConsumerType.Exclusive,
    "failover": pulsar.ConsumerType.Failover,
    "shared": pulsar.ConsumerType.Shared,
    "key_shared": pulsar.ConsumerType.KeyShared,
}


def new_client(
    service_url: str,
    *,
    operation_timeout_s: int,
    log_level: Any = pulsar.LoggerLevel.Warn,
    auth_token: str | None = None,
    tls_trust_certs_file: Path | None = None,
) -> Any:
    """A connected ``pulsar.Client`` (blocking: call on a worker thread)."""
    kw: dict[str, Any] = {
        "operation_timeout_seconds": operation_timeout_s,
        "logger": pulsar.ConsoleLogger(log_level),
    }
    if auth_token is not None:
        kw["authentication"] = pulsar.AuthenticationToken(auth_token)
    if tls_trust_certs_file is not None:
        kw["tls_trust_certs_file_path"] = str(tls_trust_certs_file)
    return pulsar.Client(service_url, **kw)


def subscribe(cfg: PulsarSourceConfig) -> tuple[Any, Any]:
    """A client and the source's consumer on its subscription (blocking); the client is
    closed again when the subscription fails."""
    client = new_client(
        cfg.service_url,
        operation_timeout_s=max(1, int(cfg.operation_timeout_s)),
        auth_token=cfg.auth_token.get_secret_value() if cfg.auth_token is not None else None,
        tls_trust_certs_file=cfg.tls_trust_certs_file,
    )
    topics: Any = (
        re.compile(re.escape(cfg.namespace_prefix) + cfg.topics_pattern)
        if cfg.topics_pattern is not None
        else [cfg.namespace_prefix + t for t in cfg.topics]
    )
    try:
        consumer = client.subscribe(
            topics,
            cfg.subscription,
            consumer_type=CONSUMER_TYPES[cfg.subscription_type],
            receiver_queue_size=cfg.receiver_queue_size,
            consumer_name=f"thalweg-{cfg.name}",
            initial_position=(
                pulsar.InitialPosition.Earliest
                if cfg.initial_position == "earliest"
                else pulsar.InitialPosition.Latest
            ),
        )
    except BaseException:
        client.close()
        raise
    return client, consumer
