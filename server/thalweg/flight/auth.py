"""Bearer-token authentication and per-topic authorisation for Flight.

A ``ServerMiddleware`` sees every call: it turns the ``authorization: Bearer <token>``
header into a :class:`Principal` (or refuses the call as UNAUTHENTICATED), and handlers
ask the principal before touching a topic. A topic a caller may not read is answered
exactly like a topic that does not exist, so names never leak.
"""

from __future__ import annotations

import fnmatch
import hmac
from dataclasses import dataclass
from typing import Any

import pyarrow.flight as fl

from thalweg.config.models import FlightAuthConfig

MIDDLEWARE_KEY = "thalweg-auth"


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
    def __init__(self, principal: Principal) -> None:
        self.principal = principal


class TokenAuthFactory(fl.ServerMiddlewareFactory):  # type: ignore[misc]
    """Checks the bearer token of every call against the configured tokens."""

    def __init__(self, cfg: FlightAuthConfig) -> None:
        self._tokens = [
            (t.token.get_secret_value().encode(), Principal(t.name, tuple(t.read), tuple(t.write)))
            for t in cfg.tokens
        ]

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> _CallPrincipal:
        values = headers.get("authorization") or headers.get("Authorization") or []
        bearer = next((v for v in values if v.startswith("Bearer ")), None)
        if bearer is None:
            raise fl.FlightUnauthenticatedError("a bearer token is required")
        presented = bearer[len("Bearer ") :].encode()
        found = None
        for secret, principal in self._tokens:  # compare against all: constant time
            if hmac.compare_digest(secret, presented):
                found = principal
        if found is None:
            raise fl.FlightUnauthenticatedError("the bearer token is not valid")
        return _CallPrincipal(found)


def principal_of(context: fl.ServerCallContext) -> Principal:
    """The caller of ``context`` (everyone may do everything when auth is off)."""
    middleware = context.get_middleware(MIDDLEWARE_KEY)
    return middleware.principal if middleware is not None else OPEN
