"""Keep a departed static member's partitions for it, for a bounded time.

With static membership (KIP-345) a gateway that restarts within its session keeps its
partitions: Kafka does not rebalance when a known ``group_instance_id`` rejoins. Some
brokers do. tansu answers a restarted static member that was the group's leader with a
new generation *and* a new rebalance; the member's SyncGroup for the first one hangs
until the second one has formed — from the other members alone. An assignor that splits
over the members present then hands the returning gateway's partitions to the others for
one generation: follow streams at them move, and the returning gateway is refused the
range the others ingested meanwhile (``docs/status.md``).

So the group leader, when the previous map names an owner location that no member of
the new generation advertises, leaves that location's partitions unassigned for
``grace_s`` (default the session timeout: what Kafka itself would wait) and names the
location as held in the map it sends. The split stays the one all members would get, so
the member's return moves nothing. A location that has not come back when its grace
runs out is not held again: every member asks the group to rebalance at that moment
(``rejoin``), naming the spent locations in its join metadata (``release``: a rejoin
with unchanged metadata is answered with the stored assignment, on tansu as on Kafka for
a follower; and the leader releases what any member names, so a member whose clock
runs ahead does not ask again and again), and the next split gives its partitions to
the members present — nothing is orphaned. A spent hold still in the map asks again
every ``REJOIN_EVERY_S`` (a request can be lost). Every member learns the held
locations and since when from the map, so a new leader keeps the first leader's clock
(wall time: gateways' clocks are assumed to agree to well within a session).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping

log = logging.getLogger(__name__)

# Past a held location's deadline before the rebalance is asked for: the assignor that
# runs then must see the grace as spent.
REJOIN_SLACK_S = 0.2
# At most one rebalance asked for in this long: a request can be lost (aiokafka drops one
# made between its JoinGroup and SyncGroup), so a spent hold still in the map asks again,
# but a member whose clock runs ahead of the leader's never asks in a tight loop. Longer
# than a join round (tansu's: ~7 s), or the asks made while the asked-for rebalance runs
# would start another one after it.
REJOIN_EVERY_S = 10.0


class StaticHold:
    """The held locations of one group member's view, and the rebalance at their end.

    Args:
        grace_s: how long a departed location's partitions stay unassigned (0: never).
        rejoin: asks this member's group coordinator to rebalance (called on the event
            loop, only while a held location's grace has run out).
        clock: wall-clock seconds (a parameter for tests).
    """

    def __init__(
        self,
        grace_s: float,
        rejoin: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.grace_s = grace_s
        self._rejoin = rejoin
        self._clock = clock
        self._since: dict[str, float] = {}
        self._held: dict[str, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._asked_at = float("-inf")

    def choose(
        self, present: Iterable[str], known: Iterable[str], released: Iterable[str] = ()
    ) -> dict[str, float]:
        """Of the ``known`` owner locations (the last map's), those absent from
        ``present`` whose grace has not run out and that no member ``released`` (its
        own clock said the grace was spent): location → since when it is absent.

        Called by the assignor (the leader); schedules the rebalance at the earliest end
        of a grace.
        """
        now = self._clock()
        here, spent = set(present), set(released)
        for loc in here:
            self._since.pop(loc, None)
        held: dict[str, float] = {}
        for loc in sorted(set(known) - here):
            since = self._since.setdefault(loc, now)
            if now - since < self.grace_s and loc not in spent:
                held[loc] = since
        # Forget what is neither held nor in the map: a location whose grace ran out and
        # whose partitions were given away starts a fresh grace if it ever owns again.
        keep = set(known)
        self._since = {loc: t for loc, t in self._since.items() if loc in keep}
        if held:
            log.info(
                "holding the partitions of %s for their static member(s) to return",
                ", ".join(sorted(held)),
            )
            self._schedule(min(held.values()) + self.grace_s - now)
        return held

    def learn(self, held: Mapping[str, float]) -> None:
        """A new assignment's held locations (every member, the leader too). The map is
        the group's truth: a later leader keeps its clock rather than restart a grace,
        and a location not held there (it came back, or was handed over) has no clock —
        one kept from an earlier absence would cut a later hold short."""
        self._held = dict(held)
        self._since = dict(held)
        if held:
            self._schedule(min(held.values()) + self.grace_s - self._clock())

    def expired(self) -> list[str]:
        """Locations the current map holds whose grace has run out."""
        now = self._clock()
        return sorted(loc for loc, t in self._held.items() if now - t >= self.grace_s)

    def _schedule(self, delay_s: float) -> None:
        if self._rejoin is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # an assignor driven outside a loop (tests): nothing to time
            return
        due = loop.time() + max(delay_s, 0.0) + REJOIN_SLACK_S
        if self._timer is not None:
            if self._timer.when() <= due:  # an earlier check stands: maps that repeat
                return  # faster than the slack must not put it off for ever
            self._timer.cancel()
        self._timer = loop.call_at(due, self._fire)

    def cancel(self) -> None:
        """Drop the pending rebalance request (the source stops)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        if not self._held or self._rejoin is None:
            return
        gone = self.expired()
        if not gone:  # an earlier check (a hold since replaced by a later one)
            self._schedule(min(self._held.values()) + self.grace_s - self._clock())
            return
        wait = self._asked_at + REJOIN_EVERY_S - self._clock()
        if wait > 0:
            self._schedule(wait - REJOIN_SLACK_S)
            return
        self._asked_at = self._clock()
        self._schedule(REJOIN_EVERY_S - REJOIN_SLACK_S)  # again, if it is still held then
        log.warning(
            "static member(s) at %s did not return within %.1f s: rebalancing to hand "
            "their partitions to the members present",
            ", ".join(gone),
            self.grace_s,
        )
        self._rejoin()
