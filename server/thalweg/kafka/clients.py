"""The connection settings a Kafka source's cluster asks of every client.

The consumer, the ``do_put`` producer and the dead-letter topic producer all talk to the
same cluster, so they must all speak its security protocol: one function builds the
aiokafka arguments (TLS context, SASL mechanism and credentials) for all three. Before it
existed the producers connected in plaintext, which a SASL or TLS cluster refuses.
"""

from __future__ import annotations

import ssl
from typing import Any

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
