"""Authentication and per-topic authorisation for Flight.

A ``ServerMiddleware`` sees every call and turns its ``authorization`` header into a
:class:`Principal`, or refuses the call as UNAUTHENTICATED before any handler runs:

* ``Bearer <token>`` — a static token from the config, or a session token issued below;
* ``Basic <base64(user:password)>`` — Flight's basic-token handshake
  (``FlightClient.authenticate_basic_token``): the credentials are checked and the reply
  carries ``authorization: Bearer <session token>`` for the calls that follow, so the
  password crosses the wire once per session, not on every call.

Handlers ask the principal before touching a topic; a topic a caller may not read is
answered exactly like a topic that does not exist, so names never leak. Secrets are
compared in constant time and never logged.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

import pyarrow.flight as fl

from thalweg.config.models import FlightAuthConfig
from thalweg.errors import InvariantError
from thalweg.flight.errors import refusals

MIDDLEWARE_KEY = "thalweg-auth"
_MAX_SESSIONS = 10_000


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller and its topic patterns."""

    name: str
    read: tuple[str, ...]
    write: tuple[str, ...]

    def may(self, verb: str, topic: str) -> bool:
        patterns = self.read if verb == "read" else self.write
        return any(fnmatch.fnmatchcase(topic, p) for p in patterns)


OPEN = Principal("anonymous", ("*",), ("*",))


class _CallPrincipal(fl.ServerMiddleware):  # type: ignore[misc]
    def __init__(self, principal: Principal, session: str | None = None) -> None:
        self.principal = principal
        self._session = session

    def sending_headers(self) -> dict[str, str]:
        # Only the handshake that signed in with basic credentials gets a token back.
        return {"authorization": f"Bearer {self._session}"} if self._session else {}


def _secret(value: Any) -> bytes:
    if value is None:
        raise InvariantError("value is not set (the config validators guarantee one is set)")
    return str(value.get_secret_value()).encode()


class TokenAuthFactory(fl.ServerMiddlewareFactory):  # type: ignore[misc]
    """Checks every call's credentials against the configured tokens and users."""

    def __init__(self, cfg: FlightAuthConfig) -> None:
        self._tokens = [
            (_secret(t.token), Principal(t.name, tuple(t.read), tuple(t.write))) for t in cfg.tokens
        ]
        self._users = {
            u.name: (_secret(u.password), Principal(u.name, tuple(u.read), tuple(u.write)))
            for u in cfg.users
        }
        self._ttl = cfg.session_ttl_s
        self._sessions: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()

    @refusals
    def start_call(self, info: Any, headers: dict[str, list[str]]) -> _CallPrincipal:
        values = headers.get("authorization") or headers.get("Authorization") or []
        for value in values:
            scheme, _, credential = value.partition(" ")
            if scheme.lower() == "bearer":
                return _CallPrincipal(self._bearer(credential.encode()))
            if scheme.lower() == "basic":
                principal = self._basic(credential)
                return _CallPrincipal(principal, self._issue(principal))
        raise fl.FlightUnauthenticatedError("a bearer token or basic credentials are required")

    def _bearer(self, presented: bytes) -> Principal:
        found = None
        for secret, principal in self._tokens:  # compare against all: constant time
            if hmac.compare_digest(secret, presented):
                found = principal
        if found is not None:
            return found
        now = time.monotonic()
        with self._lock:
            session = self._sessions.get(presented.decode("utf-8", "replace"))
        if session is not None and session[1] > now:
            return session[0]
        raise fl.FlightUnauthenticatedError("the bearer token is not valid (or has expired)")

    def _basic(self, credential: str) -> Principal:
        try:
            user, sep, password = (
                base64.b64decode(credential, validate=True).decode().partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            sep = ""
        if not sep:
            raise fl.FlightUnauthenticatedError("malformed basic credentials")
        known = self._users.get(user)
        # Compare even for an unknown user, so timing does not tell which users exist.
        expected = known[0] if known is not None else secrets.token_bytes(16)
        if not hmac.compare_digest(expected, password.encode()) or known is None:
            raise fl.FlightUnauthenticatedError("wrong user name or password")
        return known[1]

    def _issue(self, principal: Principal) -> str:
        token = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            if len(self._sessions) >= _MAX_SESSIONS:
                self._sessions = {k: v for k, v in self._sessions.items() if v[1] > now}
                if len(self._sessions) >= _MAX_SESSIONS:  # all live: drop the oldest
                    oldest = min(self._sessions, key=lambda k: self._sessions[k][1])
                    del self._sessions[oldest]
            self._sessions[token] = (principal, now + self._ttl)
        return token


class HandshakeOnly(fl.ServerAuthHandler):  # type: ignore[misc]
    """Lets Flight's Handshake call through to the middleware.

    pyarrow answers Handshake with UNIMPLEMENTED unless an auth handler is installed,
    and ``authenticate_basic_token`` is a Handshake; the real checks are the
    middleware's, so this handler accepts everything it is shown.
    """

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""


def principal_of(context: fl.ServerCallContext) -> Principal:
    """The caller of ``context`` (everyone may do everything when auth is off)."""
    middleware = context.get_middleware(MIDDLEWARE_KEY)
    return middleware.principal if middleware is not None else OPEN


def caller_key(context: fl.ServerCallContext) -> str:
    """Whom per-caller limits count: the principal, or the peer's host when auth is off."""
    middleware = context.get_middleware(MIDDLEWARE_KEY)
    if middleware is not None:
        return f"principal:{middleware.principal.name}"
    peer = str(context.peer())  # e.g. "ipv4:127.0.0.1:53712"
    return "peer:" + peer.rsplit(":", 1)[0]
