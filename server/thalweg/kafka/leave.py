"""A group's leader with other members does not send LeaveGroup when it stops; its
session runs out instead.

tansu (the Kafka-compatible broker the tests and the quickstart run) keeps a member that
leaves *during a rebalance* as the group's leader when that member led it: every later
JoinGroup names the departed leader, nobody is asked to assign, every SyncGroup answers
REBALANCE_IN_PROGRESS, and no member of the group is ever assigned again — new members
and waiting out the session change nothing (tansu ``Inner<Forming>::leave`` does not
clear the leader; the stable state's does). A member that goes silent instead is
dropped when its session times out, and the next joiner leads (soak, session 27: a
six-gateway group got no assignment for three minutes after its leader's SIGTERM). A
rebalance may start at any moment, unseen by the leader until its next heartbeat, so the
rule is that a leader with other members does not leave.

A leader *alone* in its generation still leaves: a lone gateway that restarts then
joins at once, where a member left behind for its session held the restarted one's
join for over 60 s on noida (CI, session 27). It strands the group only if another
member joins in the instant it stops.

The cost: when a leader with others stops, the group waits its session timeout before
handing its partitions over (any other member still leaves at once).
``leave_group_on_stop = "always"`` (a Kafka cluster) hands them over at once.

aiokafka leaves from its coordinator's ``_maybe_leave_group`` after the coordination
task ends, so that is where the decision is taken — at the moment of leaving, with the
generation as it then is. Without that method (another aiokafka) the member leaves as
aiokafka does, and a warning says so.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


def leave_unless_leader(consumer: Any, leads: Callable[[], bool], source: str) -> None:
    """Make ``consumer``'s coming stop skip LeaveGroup while ``leads()`` says this member
    leads the group's current generation with others in it."""
    coordinator = getattr(consumer, "_coordinator", None)
    leave: Callable[[], Awaitable[None]] | None = getattr(coordinator, "_maybe_leave_group", None)
    reset = getattr(coordinator, "reset_generation", None)
    if coordinator is None or leave is None or reset is None:
        log.warning("source %s: cannot hold back LeaveGroup; the leader leaves", source)
        return

    async def maybe_leave() -> None:
        if not leads():
            await leave()
            return
        log.info(
            "source %s: not leaving the group as its leader (a broker may keep a leader "
            "that leaves mid-rebalance); the group drops this member when its session "
            "times out",
            source,
        )
        reset()

    coordinator._maybe_leave_group = maybe_leave
