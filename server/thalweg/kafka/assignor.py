"""A group assignor that tells every member who owns every partition.

Kafka's consumer protocol carries opaque ``user_data`` both ways: a member's join
metadata (here: its advertised Flight location) and the leader's assignment of each
member (here: the whole partition → location map). Partitions are split round-robin
as aiokafka's default assignor does — with static membership (``group_instance_id``)
over the members ordered by their advertised location rather than by member id (which
the broker draws anew at every restart): the same gateways always get the same split.
A gateway restarted with static membership thus gets its partitions back even from a
broker that answers a returning static member with a full rebalance (tansu), and keeps
them without any rebalance where the broker implements KIP-345. When such a rebalance
forms a generation without the returning member, its partitions are held for it for a
bounded time rather than split among the others (:mod:`thalweg.kafka.hold`). The
broker stores and forwards these bytes without reading them, so this works on every
Kafka-protocol broker (tested on tansu) and needs no coordination of Thalweg's own.

Members announce this protocol alone: a second one (plain ``roundrobin``, for a group
that still has an older gateway) cost tansu a second join round — 10 s to the first
assignment instead of 5 s. A group is therefore all of one version: replace every
member of an older one, or start the new version on a new ``group_id`` (it resumes from
the lanes, not from the old group's commits).

aiokafka's assignor interface is class-level, so each source gets its own subclass
bound to its directory and location (:func:`owner_assignor`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from thalweg.group.owners import OwnerDirectory
from thalweg.kafka.hold import StaticHold

log = logging.getLogger(__name__)

PROTOCOL = "thalweg-owners-v1"


def owner_assignor(
    directory: OwnerDirectory,
    generation: Callable[[], int],
    *,
    by_location: bool = False,
    hold: StaticHold | None = None,
    on_lead: Callable[[int], None] | None = None,
) -> type[RoundRobinPartitionAssignor]:
    """A round-robin assignor class that publishes the group's owners to ``directory``.

    ``by_location``: order members by advertised location (static membership, so a
    restarted gateway gets its own partitions back), not by member id. Only then: a
    member that returns to the same partitions after a pause past its session can leave
    a follow stream at it jumping what another member ingested meanwhile (docs/status.md).

    Args:
        directory: where the map lands; its ``location`` is what this member announces.
        generation: the member's current group generation (read when an assignment
            arrives, after the client stored the new one).
        hold: with ``by_location``, keeps an absent owner's partitions unassigned for
            its grace (the owner map still names it), so its return moves nothing.
        on_lead: called with the number of members when this member assigns, i.e.
            leads the generation being formed (the client stored its number already;
            ``thalweg.kafka.leave``).
    """

    class OwnerAssignor(RoundRobinPartitionAssignor):  # type: ignore[misc]
        name = PROTOCOL
        version = 0

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            body: dict[str, Any] = {"v": 1, "location": directory.location}
            if hold is not None and (spent := hold.expired()):
                # Changed join metadata is what makes a broker rebalance a stable group
                # (tansu answers an unchanged rejoin with the stored assignment).
                body["release"] = spent
            data = json.dumps(body).encode()
            return ConsumerProtocolMemberMetadata(cls.version, list(topics), data)

        @classmethod
        def assign(
            cls,
            cluster: ClusterMetadata,
            members: Mapping[str, ConsumerProtocolMemberMetadata],
        ) -> dict[str, ConsumerProtocolMemberAssignment]:
            if on_lead is not None:
                on_lead(len(members))
            locations = {m: _location(meta.user_data) for m, meta in members.items()}
            _warn_on_shared_locations(locations)
            topics = sorted({t for meta in members.values() for t in meta.subscription})
            held = _held(topics, members, locations, directory, hold) if by_location else {}
            everyone = dict(members)
            for loc in held:  # a stand-in per held location: the split all would get
                everyone[_HELD + loc] = ConsumerProtocolMemberMetadata(cls.version, topics, b"")
                locations[_HELD + loc] = loc
            keys = locations if by_location else {}
            split = _split(cluster, everyone, keys, cls.version)
            owners: dict[str, dict[str, str | None]] = {}
            for member, given in split.items():
                for topic, partitions in given.assignment:
                    for p in partitions:
                        owners.setdefault(topic, {})[str(p)] = locations.get(member)
            body: dict[str, Any] = {"v": 1, "owners": owners}
            if held:
                body["held"] = held
            data = json.dumps(body, sort_keys=True).encode()
            return {
                m: ConsumerProtocolMemberAssignment(a.version, a.assignment, data)
                for m, a in split.items()
                if m in members
            }

        @classmethod
        def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
            owners = _owners(assignment.user_data)
            if owners is None:
                log.warning("group assignment carries no owner map; serving alone")
                return
            held = _held_of(assignment.user_data)
            if hold is not None:
                hold.learn(held)
            directory.publish(generation(), owners, held)

    return OwnerAssignor


# The member id of a held location's stand-in: no broker-drawn member id starts so.
_HELD = "\x00held:"


def _held(
    topics: Iterable[str],
    members: Mapping[str, ConsumerProtocolMemberMetadata],
    locations: Mapping[str, str | None],
    directory: OwnerDirectory,
    hold: StaticHold | None,
) -> dict[str, float]:
    """The last map's owner locations (of the ``topics`` subscribed now) that no member
    of this generation advertises and whose grace has not run out."""
    if hold is None or hold.grace_s <= 0:
        return {}
    subscribed = set(topics)
    known = {
        loc
        for topic, parts in directory.owners().items()
        if topic in subscribed
        for loc in parts.values()
        if loc is not None
    }
    released = {loc for meta in members.values() for loc in _released(meta.user_data)}
    return hold.choose({loc for loc in locations.values() if loc is not None}, known, released)


def _split(
    cluster: ClusterMetadata,
    members: Mapping[str, ConsumerProtocolMemberMetadata],
    locations: Mapping[str, str | None],
    version: int,
) -> dict[str, ConsumerProtocolMemberAssignment]:
    """Every subscribed partition, in (topic, partition) order, to the next member in
    location order that subscribes to its topic (member id breaks ties and orders
    members without a location last)."""
    order = sorted(members, key=lambda m: (locations.get(m) is None, locations.get(m) or "", m))
    topics = sorted({t for meta in members.values() for t in meta.subscription})
    given: dict[str, dict[str, list[int]]] = {m: {} for m in order}
    turn = 0
    for topic in topics:
        partitions = cluster.partitions_for_topic(topic)
        if partitions is None:
            log.warning("no partition metadata for topic %s", topic)
            continue
        takers = [m for m in order if topic in members[m].subscription]
        for p in sorted(partitions):
            # Keep one turn across topics, as a round-robin over all partitions does.
            while order[turn % len(order)] not in takers:
                turn += 1
            given[order[turn % len(order)]].setdefault(topic, []).append(p)
            turn += 1
    return {
        m: ConsumerProtocolMemberAssignment(version, sorted(given[m].items()), b"") for m in order
    }


def _location(user_data: bytes | None) -> str | None:
    try:
        found = json.loads(user_data or b"{}").get("location")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def _owners(user_data: bytes | None) -> dict[str, dict[int, str | None]] | None:
    try:
        body: Any = json.loads(user_data or b"")
        raw = body["owners"]
        return {
            str(t): {int(p): (loc if isinstance(loc, str) else None) for p, loc in parts.items()}
            for t, parts in raw.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _released(user_data: bytes | None) -> list[str]:
    try:
        found = json.loads(user_data or b"{}").get("release", [])
    except (ValueError, AttributeError):
        return []
    return [loc for loc in found if isinstance(loc, str)] if isinstance(found, list) else []


def _held_of(user_data: bytes | None) -> dict[str, float]:
    try:
        raw = json.loads(user_data or b"").get("held", {})
        return {str(loc): float(since) for loc, since in raw.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def _warn_on_shared_locations(locations: Mapping[str, str | None]) -> None:
    seen: dict[str, str] = {}
    for member, loc in sorted(locations.items()):
        if loc is None:
            continue
        if loc in seen:
            log.warning(
                "members %s and %s both advertise %s: set gateway.flight_advertise per "
                "replica, or readers cannot be sent to a partition's owner",
                seen[loc],
                member,
                loc,
            )
        seen[loc] = member
