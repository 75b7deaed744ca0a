"""Per-caller limits on open Flight streams.

A slot is taken when ``do_get``/``do_put`` is called, so an over-limit call is refused
before it starts (UNAVAILABLE, with the limit's name: retry once a stream ends). A
``do_get`` slot is released when its batch generator finishes, fails or is collected (a
generator the client cancelled before its first batch never runs its ``finally``, so the
server also ties release to the generator's lifetime).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import pyarrow.flight as fl


class Slot:
    """One open stream of one caller; releasing twice is harmless."""

    def __init__(
        self, limiter: StreamLimiter, key: str, on_release: Callable[[], None] | None
    ) -> None:
        self._limiter = limiter
        self._key = key
        self._on_release = on_release
        self._held = True
        self._lock = threading.Lock()  # the generator and its finalizer may race

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._limiter._release(self._key)
            if self._on_release is not None:
                self._on_release()


class StreamLimiter:
    """Counts open streams per caller key."""

    def __init__(self, max_per_caller: int) -> None:
        self._max = max_per_caller
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def acquire(self, key: str, on_release: Callable[[], None] | None = None) -> Slot:
        """A slot for ``key``; ``on_release`` runs once, when the slot is given back."""
        with self._lock:
            if self._open[key] >= self._max:
                raise fl.FlightUnavailableError(
                    f"too many open streams for this caller ({self._max}; "
                    "gateway.flight.max_streams_per_caller); retry when one has ended"
                )
            self._open[key] += 1
        return Slot(self, key, on_release)

    def open_streams(self, key: str) -> int:
        with self._lock:
            return self._open[key]

    def _release(self, key: str) -> None:
        with self._lock:
            self._open[key] -= 1
            if self._open[key] <= 0:
                del self._open[key]
