"""One login before the consumer starts, so a refused one is named, typed and survived.

aiokafka's bootstrap catches every connection failure, logs it and raises only "Unable to
bootstrap from [...]": the gateway's warning and ``/health`` said "cannot connect", and
only aiokafka's own log line named the cause. Worse, a SCRAM login refused the way RFC
5802 and tansu do it (a server-final message ``e=unknown-user`` with no error code)
escaped aiokafka as ``KeyError: 'v'`` and ended ``twg stream`` with a traceback.

:func:`check_login` opens one connection to a bootstrap broker with exactly the settings
every client of the source uses (``security_kwargs``) and turns what went wrong into a
:class:`~thalweg.errors.LoginRefusedError` whose message says *authentication* or *TLS*,
which credential or file to check, and the broker's own words — or a plain
:class:`~thalweg.errors.SourceError` when no broker answered at all. The source runs it
before each start; the runner retries a refused login on its own, slower backoff.
"""

from __future__ import annotations

import asyncio
import ssl

from aiokafka.conn import collect_hosts, create_conn
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from thalweg.config.models import KafkaSourceConfig
from thalweg.errors import LoginRefusedError, SourceError
from thalweg.kafka.clients import security_kwargs


async def check_login(cfg: KafkaSourceConfig) -> None:
    """Connect and log in to one bootstrap broker as the source's clients will.

    Raises:
        LoginRefusedError: a broker answered and refused (credential, certificate,
            token).
        SourceError: no bootstrap broker could be reached.
    """
    kw = security_kwargs(cfg)
    failures: list[str] = []
    for host, port, _family in collect_hosts(cfg.bootstrap_servers):
        where = f"{host}:{port}"
        try:
            conn = await create_conn(
                host,
                port,
                client_id=f"thalweg-{cfg.name}",
                request_timeout_ms=cfg.request_timeout_ms,
                **kw,
            )
        except Exception as exc:  # classified below; anything else is not a login answer
            refused = refusal(cfg, where, exc)
            if refused is not None:
                raise refused from exc
            failures.append(f"{where}: {exc or type(exc).__name__}")
            continue
        conn.close()
        return
    raise SourceError(
        f"source {cfg.name!r}: cannot connect to {cfg.bootstrap_servers}: {'; '.join(failures)}"
    )


def refusal(cfg: KafkaSourceConfig, where: str, exc: BaseException) -> LoginRefusedError | None:
    """The login failure ``exc`` is, as a typed error naming what to check; None when it
    is not one (a broker down or unreachable)."""
    who = _who(cfg)
    if isinstance(exc, LoginRefusedError):  # a token provider's own failure
        return LoginRefusedError(f"source {cfg.name!r}: authentication failed at {where}: {exc}")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return LoginRefusedError(
            f"source {cfg.name!r}: TLS failed at {where}: the broker's certificate is not "
            f"trusted ({exc.verify_message}); check ssl_cafile"
        )
    if isinstance(exc, ssl.SSLError):
        return LoginRefusedError(
            f"source {cfg.name!r}: TLS failed at {where}: {exc.reason or exc}; a broker "
            "that requires a client certificate refuses one missing or unsigned by its CA "
            "(check ssl_certfile and ssl_keyfile)"
        )
    if isinstance(exc, SaslAuthenticationFailed | IllegalSaslStateError):
        return LoginRefusedError(
            f"source {cfg.name!r}: authentication failed at {where} ({who}): the broker "
            f"refused the credentials: {_said(exc)}; {_check(cfg)}"
        )
    if isinstance(exc, UnsupportedSaslMechanismError):
        return LoginRefusedError(
            f"source {cfg.name!r}: authentication failed at {where}: {exc}; check sasl_mechanism"
        )
    if isinstance(exc, KeyError | ValueError) and (cfg.sasl_mechanism or "").startswith("SCRAM"):
        # aiokafka's SCRAM client reads a server-final "e=…" (RFC 5802's refusal) as a
        # missing "v" (KeyError), and a wrong server signature as a ValueError.
        return LoginRefusedError(
            f"source {cfg.name!r}: authentication failed at {where} ({who}): the broker "
            f"ended the SCRAM exchange without accepting it ({type(exc).__name__}: {exc}); "
            f"{_check(cfg)}"
        )
    if (
        isinstance(exc, KafkaConnectionError | ConnectionError | asyncio.IncompleteReadError)
        and cfg.security_protocol in ("SSL", "SASL_SSL")
        and cfg.ssl_certfile is None
        and "closed" in str(exc).lower()
    ):
        # TLS 1.3 completes the client's handshake before the server checks the client's
        # certificate: a broker that requires one just closes the connection.
        return LoginRefusedError(
            f"source {cfg.name!r}: TLS failed at {where}: the broker closed the connection "
            f"during the login ({exc}); a broker that requires a client certificate does "
            "this (set ssl_certfile and ssl_keyfile)"
        )
    return None  # not a login answer (a group or request error is the source's to report)


def _who(cfg: KafkaSourceConfig) -> str:
    if cfg.sasl_mechanism == "OAUTHBEARER" and cfg.sasl_oauth is not None:
        return f"OAUTHBEARER, token from {cfg.sasl_oauth.provider}"
    return f"{cfg.sasl_mechanism} as {cfg.sasl_username!r}"


def _check(cfg: KafkaSourceConfig) -> str:
    if cfg.sasl_mechanism == "OAUTHBEARER":
        return "check the token provider (sasl_oauth) and the principal's permissions"
    return "check sasl_username and sasl_password (and sasl_mechanism)"


def _said(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__
