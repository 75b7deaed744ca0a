"""Which gateway of a consumer group ingests each partition, and where it serves Flight.

Several gateways on one consumer group split a topic's partitions between them. A
replica holds the live tail only of the partitions it ingests (and, with a local
``data_dir``, only their history too), so a reader connected to any one replica must be
sent to the owner of the others. Kafka's group protocol is the only coordinator: every
member puts its advertised Flight location into its join metadata, the group leader's
assignor hands every member the whole partition → location map with its assignment
(:mod:`thalweg.kafka.assignor`), and each member publishes it here. Nothing is stored or
exchanged outside the group protocol, and the map is exactly as fresh as the group's
current generation.

Read by the Flight threads; written on the event loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping


class OwnerDirectory:
    """The group's current partition → owner location map, as last assigned.

    Attributes:
        location: this gateway's advertised Flight location (set once Flight listens).
        shared_lane: every gateway of the group writes one shared ``data_dir``, so any
            of them can serve every partition's durable history.
    """

    def __init__(
        self,
        *,
        shared_lane: bool = False,
        on_publish: Callable[[OwnerDirectory], None] | None = None,
    ) -> None:
        self.location: str | None = None
        self.shared_lane = shared_lane
        self._on_publish = on_publish
        self._lock = threading.Lock()
        self._owners: dict[str, dict[int, str | None]] = {}
        self._generation: int | None = None
        self._since: float | None = None
        self._expected: set[str] = set()
        self._expect_any = False
        self._held: dict[str, float] = {}

    @property
    def active(self) -> bool:
        """Whether a group assignment has published a map (a Kafka group with the
        ``thalweg`` assignor); without one every read is served locally, as alone."""
        with self._lock:
            return self._generation is not None

    def publish(
        self,
        generation: int,
        owners: Mapping[str, Mapping[int, str | None]],
        held: Mapping[str, float] | None = None,
    ) -> None:
        """Replace the map with a new generation's (the topics of one source).

        ``held``: owner locations whose member is absent and waited for (static
        membership, :mod:`thalweg.kafka.hold`), and since when; shown in ``/stats``.
        """
        with self._lock:
            for topic, parts in owners.items():
                self._owners[topic] = dict(parts)
            self._generation = generation
            self._since = time.time()
            self._held = dict(held or {})
        if self._on_publish is not None:
            self._on_publish(self)

    def expect(self, topics: Iterable[str] | None) -> None:
        """A source joins the group with the owner assignor for ``topics`` (None: by a
        pattern, its topics known only once assigned).

        Until the group's map names such a topic, this member cannot tell a partition
        it will be handed (or will learn another member owns) from one that does not
        exist: a gateway restarted into a running group is asked for partitions the
        others' maps already send to it, seconds before its own assignment arrives.
        :meth:`awaiting` says so, and a read is told to retry rather than refused.
        """
        with self._lock:
            if topics is None:
                self._expect_any = True
            else:
                self._expected.update(topics)

    def awaiting(self, topic: str) -> bool:
        """Whether ``topic``'s partitions are not known yet because this member's
        group assignment has not arrived (see :meth:`expect`)."""
        with self._lock:
            if topic in self._owners:
                return False
            return topic in self._expected or (self._expect_any and self._generation is None)

    def owner(self, topic: str, partition: int) -> str | None:
        """The owner's advertised location; None when unknown or it advertises none."""
        with self._lock:
            return self._owners.get(topic, {}).get(partition)

    def owned_elsewhere(self, topic: str, partition: int) -> str | None:
        """The location of the member that owns ``partition`` when it is another gateway
        (None: this gateway owns it, or nobody is known to)."""
        with self._lock:
            if self._generation is None:
                return None
            if partition not in self._owners.get(topic, {}):
                return None
            found = self._owners[topic][partition]
        if found is None or found == self.location:
            return None
        return found

    def owners(self) -> dict[str, dict[int, str | None]]:
        """A copy of the whole map: topic → partition → owner location."""
        with self._lock:
            return {t: dict(parts) for t, parts in self._owners.items()}

    def partitions(self, topic: str) -> list[int]:
        """Every partition of ``topic`` the group assigned (this member's or not)."""
        with self._lock:
            return sorted(self._owners.get(topic, {}))

    def snapshot(self) -> dict[str, object]:
        """The map for ``/stats``: generation, when it arrived, owners by topic, and the
        owner locations held for an absent static member (since when)."""
        with self._lock:
            return {
                "location": self.location,
                "shared_lane": self.shared_lane,
                "generation": self._generation,
                "since": self._since,
                "owners": {
                    t: {str(p): loc for p, loc in sorted(parts.items())}
                    for t, parts in sorted(self._owners.items())
                },
                "held": dict(sorted(self._held.items())),
            }
