"""Bearer tokens for ``OAUTHBEARER`` logins: a file, an OIDC endpoint, or AWS MSK IAM.

aiokafka asks its ``sasl_oauth_token_provider`` for a token at every login (a new
connection, a reconnect). Each provider here answers from a cache while the token has
more than a fifth of its life left, so a reconnect storm never becomes a token-endpoint
storm; a failure to get one is an :class:`~thalweg.errors.LoginRefusedError` naming the
provider, which the source reports and retries with the login backoff.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from aiokafka.abc import AbstractTokenProvider

from thalweg.config.kafka_security import SaslOAuthConfig
from thalweg.errors import LoginRefusedError

#: Renew a cached token once less than this share of its lifetime is left.
RENEW_AT = 0.2


class _Cached(AbstractTokenProvider):  # type: ignore[misc]
    """A provider whose tokens come with a lifetime: fetched on a worker thread, kept
    until :data:`RENEW_AT` of the lifetime is left."""

    what = "token provider"

    def __init__(self, cfg: SaslOAuthConfig) -> None:
        self.cfg = cfg
        self._token: str | None = None
        self._renew_at = 0.0
        self.fetches = 0

    async def token(self) -> str:
        if self._token is None or time.monotonic() >= self._renew_at:
            try:
                token, lifetime_s = await asyncio.wait_for(
                    asyncio.to_thread(self._fetch), self.cfg.token_timeout_s
                )
            except LoginRefusedError:
                raise
            except Exception as exc:  # any failure of the IdP or the signer
                why = f"OAUTHBEARER: no token from the {self.what}: {exc}"
                raise LoginRefusedError(why) from exc
            self.fetches += 1
            self._token = token
            self._renew_at = time.monotonic() + lifetime_s * (1 - RENEW_AT)
        return self._token

    def extensions(self) -> dict[str, str]:
        return dict(self.cfg.extensions)

    @abc.abstractmethod
    def _fetch(self) -> tuple[str, float]:
        """A new token and its lifetime in seconds (on a worker thread)."""


class FileToken(AbstractTokenProvider):  # type: ignore[misc]
    """The token in a file, read at every login (a sidecar or a projected volume may
    replace it at any time)."""

    def __init__(self, cfg: SaslOAuthConfig) -> None:
        assert_set(cfg.token_file, "token_file")
        self.cfg = cfg

    async def token(self) -> str:
        path = self.cfg.token_file
        try:
            text = await asyncio.to_thread(path.read_text) if path else ""
        except OSError as exc:
            raise LoginRefusedError(f"OAUTHBEARER: cannot read token_file {path}: {exc}") from exc
        token = text.strip()
        if not token:
            raise LoginRefusedError(f"OAUTHBEARER: token_file {path} is empty")
        return token

    def extensions(self) -> dict[str, str]:
        return dict(self.cfg.extensions)


class OidcToken(_Cached):
    """The OAuth 2.0 client-credentials grant (RFC 6749 4.4) against ``token_url``, the
    client authenticated with HTTP Basic (RFC 6749 2.3.1), as Confluent Cloud's and
    Keycloak's or Okta's token endpoints expect."""

    what = "OIDC token endpoint"

    def _fetch(self) -> tuple[str, float]:
        cfg = self.cfg
        assert_set(cfg.token_url, "token_url")
        secret = cfg.client_secret.get_secret_value() if cfg.client_secret else ""
        form = {"grant_type": "client_credentials"}
        if cfg.scope:
            form["scope"] = cfg.scope
        basic = base64.b64encode(
            f"{urllib.parse.quote(cfg.client_id or '')}:{urllib.parse.quote(secret)}".encode()
        ).decode()
        req = urllib.request.Request(
            str(cfg.token_url),
            data=urllib.parse.urlencode(form).encode(),
            headers={
                "Authorization": f"Basic {basic}",
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=cfg.token_timeout_s) as resp:
                body: dict[str, Any] = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:200].decode(errors="replace")
            raise LoginRefusedError(
                f"OAUTHBEARER: the OIDC token endpoint refused client {cfg.client_id!r}: "
                f"HTTP {exc.code} {detail}"
            ) from exc
        token = body.get("access_token")
        if not isinstance(token, str) or not token:
            raise LoginRefusedError("OAUTHBEARER: the OIDC token endpoint sent no access_token")
        return token, float(body.get("expires_in", 300))


class MskIamToken(_Cached):
    """AWS MSK IAM: a SigV4-signed ``kafka-cluster:Connect`` URL from
    ``aws-msk-iam-sasl-signer-python`` (the ``msk`` extra), signed locally with the
    default AWS credential chain."""

    what = "MSK IAM signer"

    def _fetch(self) -> tuple[str, float]:
        try:
            from aws_msk_iam_sasl_signer import (  # type: ignore[import-untyped]
                MSKAuthTokenProvider,
            )
        except ImportError as exc:
            raise LoginRefusedError(
                "OAUTHBEARER with aws_region (MSK IAM) needs the 'msk' extra: "
                "pip install 'thalweg[msk]'"
            ) from exc
        token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(self.cfg.aws_region)
        return str(token), max(1.0, expiry_ms / 1000 - time.time())


def assert_set(value: object, name: str) -> None:
    if value is None:
        raise LoginRefusedError(f"OAUTHBEARER: sasl_oauth.{name} is not set")


PROVIDERS: dict[str, Callable[[SaslOAuthConfig], AbstractTokenProvider]] = {
    "file": FileToken,
    "oidc": OidcToken,
    "msk_iam": MskIamToken,
}


def token_provider(cfg: SaslOAuthConfig) -> AbstractTokenProvider:
    """The provider ``cfg`` names."""
    return PROVIDERS[cfg.provider](cfg)
