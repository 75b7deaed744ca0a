"""What the ingest loop needs from a transport, whatever the broker.

A source hands over Arrow (one raw-lane batch per partition per fetch, positions
ascending and never repeated) and advances the broker's position only when told to by
``commit`` — which the runner calls after the raw lane covering it is durable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

PartitionKey = tuple[str, int]
RebalanceCallback = Callable[[list[PartitionKey]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class GroupSession:
    """A consumer-group session: missing heartbeats for ``timeout_ms`` hands this
    member's partitions to another, so its writes must stop before that (the fence)."""

    timeout_ms: int
    heartbeat_interval_ms: int


class DeadLetterOutlet(Protocol):
    """Where a source's dead letters are produced besides the ``dlq/`` lane (a Kafka
    DLQ topic): sent before the commit that passes them."""

    topic: str

    async def send(self, dead: pa.Table) -> int:
        """Produce every dead letter, waiting for each acknowledgement; the count."""

    async def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SourceFeatures:
    """What a source can do beyond the protocol: the engine switches its machinery on
    from these answers, never from the type of the source's config. The defaults are a
    source with no group, no DLQ topic and no broker to ask about topics.

    Attributes:
        session: the group session whose expiry fences this member's writes.
        group_id: the consumer group sharing the partitions (/health says so when this
            member holds none).
        dead_letters: the outlet dead letters are produced to before their commit.
        dead_letters_max_wait_s: how long the commit waits for that outlet (None: until
            it answers).
        missing_topic_grace_s: how long a configured topic may be missing on the broker
            before it gates readiness (None: the broker cannot tell).
        new_epoch_on_divergence: a log that no longer continues the lane starts a new
            epoch instead of stopping the partition.
        login_retry_max_s: the longest wait between refused logins (None: the default).
    """

    session: GroupSession | None = None
    group_id: str | None = None
    dead_letters: DeadLetterOutlet | None = None
    dead_letters_max_wait_s: float | None = None
    missing_topic_grace_s: float | None = None
    new_epoch_on_divergence: bool = False
    login_retry_max_s: float | None = None


class Source(Protocol):
    """One configured source's connection to its broker."""

    # True when a partition's positions are broker offsets that only grow and whose log
    # bounds the broker reports (Kafka): the runner then checks log continuity.
    positions_are_offsets: bool

    def features(self) -> SourceFeatures:
        """What this source can do (asked once, when its runner is made)."""

    async def start(self, on_assigned: RebalanceCallback, on_revoked: RebalanceCallback) -> None:
        """Connect; partitions are announced through ``on_assigned`` before any of their
        records is returned by :meth:`fetch`."""

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[PartitionKey, pa.RecordBatch]:
        """At most ``max_records`` new records, one raw-lane batch per partition."""

    async def probe(self, timeout_s: float = 3.0) -> bool:
        """Whether a broker answers now (for /ready)."""

    def membership(self) -> tuple[bool, float | None]:
        """Whether the group still knows this member, and when (``time.monotonic``) a
        heartbeat last succeeded (None: not observable)."""

    def generation(self) -> int:
        """The ownership generation of this member's partitions (Kafka: the group
        generation; 0 where the transport has none): it names object-store segments."""

    async def log_start(self, key: PartitionKey) -> int:
        """The broker's log start position of ``key``, asked now."""

    async def missing_topics(self) -> list[str]:
        """Configured topics the broker does not have (empty where it cannot tell)."""

    def ended(self) -> list[PartitionKey]:
        """Partitions whose every record has been returned since the last call (a file
        read to its end): their buffers become segments now rather than at roll time."""

    def highwater(self, key: PartitionKey) -> int | None:
        """The broker's end of a partition as a position, when known cheaply (Kafka:
        from the last fetch response, empty ones included)."""

    async def commit(self, positions: dict[PartitionKey, int]) -> None:
        """Tell the broker everything below ``positions`` is safely stored."""

    async def committed(self, key: PartitionKey) -> int | None:
        """The position the broker resumes ``key`` from, when the broker can say."""

    def seek(self, key: PartitionKey, position: int) -> None:
        """Return nothing below ``position`` for ``key`` from now on."""

    def pause(self, keys: list[PartitionKey]) -> None: ...

    def resume(self, keys: list[PartitionKey]) -> None: ...

    async def stop(self) -> None:
        """Close connections (leave the group / close the consumer)."""


class Unbrokered:
    """The answers of a source with no broker behind it (files, another gateway over
    Flight): no group to belong to, no generations, positions that start at 0, no
    topics to miss. A subclass that can tell whether its upstream answers overrides
    :meth:`probe`."""

    def features(self) -> SourceFeatures:
        return SourceFeatures()

    async def probe(self, timeout_s: float = 3.0) -> bool:
        return True

    def membership(self) -> tuple[bool, float | None]:
        return True, None

    def generation(self) -> int:
        return 0

    async def log_start(self, key: PartitionKey) -> int:
        return 0

    async def missing_topics(self) -> list[str]:
        return []
