"""Registry errors: unavailable is retriable (pause and retry), the rest is not."""

from __future__ import annotations

from thalweg.errors import ThalwegError


class RegistryError(ThalwegError):
    """The registry answered, but not with a usable schema (bad auth, bad response)."""


class RegistryUnavailableError(RegistryError):
    """Connection refused, timeout or a 5xx: records wait; none is dead-lettered for it."""

    retriable = True
