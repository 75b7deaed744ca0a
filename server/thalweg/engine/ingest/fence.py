"""Ownership fencing: a member that may have lost its partitions writes nothing more.

A consumer-group member paused past its session timeout (a GC pause, SIGSTOP, a frozen
VM) is evicted and its partitions go to another member. When it resumes, its flushes
are overdue and would write segments for partitions it no longer owns — duplicates
beside the new owner's, or overlapping files in a shared lane.

The fence doubts ownership as soon as anything suggests it may be lost — the event loop
did not turn for longer than is safe for the group session, the client no longer knows
its member id, a commit was refused — and from then on every rename asks :meth:`check`,
which refuses. Doubt clears only on evidence: a fresh assignment, or a heartbeat that
succeeded after the doubt began. :meth:`check` is called from writer threads and also
refuses when the loop has not ticked for too long, so a write that was already under
way when the process froze is refused even before the loop runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from thalweg.errors import OwnershipLostError

log = logging.getLogger(__name__)

TICK_S = 0.1

Membership = Callable[[], tuple[bool, float | None]]


class OwnershipFence:
    """Doubt, checks and evidence of one source's group membership."""

    def __init__(self, stall_limit_s: float, membership: Membership) -> None:
        self.stall_limit_s = stall_limit_s
        self._membership = membership
        self._lock = threading.Lock()
        self._last_tick = time.monotonic()
        self._doubt_since: float | None = None
        self._reason = ""

    @classmethod
    def for_session(
        cls, session_timeout_ms: int, heartbeat_ms: int, membership: Membership
    ) -> OwnershipFence:
        """A stall limit that leaves the session at least two heartbeats of margin."""
        session = session_timeout_ms / 1000
        limit = max(session - 2 * heartbeat_ms / 1000, session / 2)
        return cls(limit, membership)

    def membership_ok(self) -> bool:
        """Whether the client still holds a group membership."""
        return self._membership()[0]

    @property
    def in_doubt(self) -> bool:
        with self._lock:
            return self._doubt_since is not None

    @property
    def reason(self) -> str:
        with self._lock:
            return self._reason

    def doubt(self, reason: str) -> None:
        """Ownership may be lost: refuse renames until there is evidence it is not."""
        with self._lock:
            if self._doubt_since is not None:
                return
            self._doubt_since = time.monotonic()
            self._reason = reason
        log.warning("ownership of this member's partitions is in doubt: %s", reason)

    def confirm(self, why: str) -> None:
        """Evidence that the member owns what it holds now (an assignment)."""
        with self._lock:
            was = self._doubt_since is not None
            self._doubt_since = None
            self._reason = ""
            self._last_tick = time.monotonic()
        if was:
            log.warning("ownership confirmed (%s); writing resumes", why)

    def try_clear(self) -> bool:
        """Clear the doubt when a heartbeat succeeded after it began; True if cleared."""
        valid, beat = self._membership()
        with self._lock:
            since = self._doubt_since
        if since is None:
            return True
        if valid and beat is not None and beat > since:
            self.confirm("a group heartbeat succeeded since")
            return True
        return False

    def check(self) -> None:
        """Raise :class:`OwnershipLostError` unless renames are safe now (any thread)."""
        now = time.monotonic()
        with self._lock:
            reason = self._reason if self._doubt_since is not None else ""
            stalled = now - self._last_tick
        if not reason and stalled > self.stall_limit_s:
            reason = f"the event loop has not run for {stalled:.1f}s"
            self.doubt(reason)
        if reason:
            raise OwnershipLostError(f"not written: partition ownership in doubt ({reason})")

    async def run(self, stop: asyncio.Event) -> None:
        """Tick, and doubt when a tick comes late or the client lost its membership.

        The clock starts here, not at construction: a source's start waits for the
        group's first assignment, and a long wait is not a paused loop (soak, session
        26: a group that formed no generation for three minutes was reported as six
        event loops "paused" for 180 s)."""
        with self._lock:
            self._last_tick = time.monotonic()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TICK_S)
            now = time.monotonic()
            with self._lock:
                gap = now - self._last_tick
                self._last_tick = now
            if gap > self.stall_limit_s:
                self.doubt(f"the event loop was paused for {gap:.1f}s")
            valid, _ = self._membership()
            if not valid:
                self.doubt("the group no longer knows this member")
