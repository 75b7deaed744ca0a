"""A group assignor that tells every member who owns every partition.

Kafka's consumer protocol carries opaque ``user_data`` both ways: a member's join
metadata (here: its advertised Flight location) and the leader's assignment of each
member (here: the whole partition → location map). Partitions are split round-robin
as aiokafka's default assignor does — with static membership (``group_instance_id``)
over the members ordered by their advertised location rather than by member id (which
the broker draws anew at every restart): the same gateways always get the same split.
A gateway restarted with static membership thus gets its partitions back even from a
broker that answers a returning static member with a full rebalance (tansu), and keeps
them without any rebalance where the broker implements KIP-345. The broker stores and
forwards these bytes without reading them, so this works on every Kafka-protocol
broker (tested on tansu) and needs no coordination of Thalweg's own.

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

log = logging.getLogger(__name__)

PROTOCOL = "thalweg-owners-v1"


def owner_assignor(
    directory: OwnerDirectory, generation: Callable[[], int], *, by_location: bool = False
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
    """

    class OwnerAssignor(RoundRobinPartitionAssignor):  # type: ignore[misc]
        name = PROTOCOL
        version = 0

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            data = json.dumps({"v": 1, "location": directory.location}).encode()
            return ConsumerProtocolMemberMetadata(cls.version, list(topics), data)

        @classmethod
        def assign(
            cls,
            cluster: ClusterMetadata,
            members: Mapping[str, ConsumerProtocolMemberMetadata],
        ) -> dict[str, ConsumerProtocolMemberAssignment]:
            locations = {m: _location(meta.user_data) for m, meta in members.items()}
            keys = locations if by_location else {}
            split = _split(cluster, members, keys, cls.version)
            _warn_on_shared_locations(locations)
            owners: dict[str, dict[str, str | None]] = {}
            for member, given in split.items():
                for topic, partitions in given.assignment:
                    for p in partitions:
                        owners.setdefault(topic, {})[str(p)] = locations.get(member)
            data = json.dumps({"v": 1, "owners": owners}, sort_keys=True).encode()
            return {
                m: ConsumerProtocolMemberAssignment(a.version, a.assignment, data)
                for m, a in split.items()
            }

        @classmethod
        def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
            owners = _owners(assignment.user_data)
            if owners is None:
                log.warning("group assignment carries no owner map; serving alone")
                return
            directory.publish(generation(), owners)

    return OwnerAssignor


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
