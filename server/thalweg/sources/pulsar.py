"""Pulsar through the official pulsar-client: one subscription, acknowledged only after
the raw lane holding a message is durable.

The client is blocking C++ underneath, so receives, acknowledgements and closes run on
worker threads. Three things differ from Kafka and are handled here, at the edge:

* **Positions.** A message id is packed into an int64 lane position
  (``thalweg.records.position``), so the runner orders, names and resumes Pulsar lanes
  exactly as it does Kafka's.
* **Resuming.** The broker keeps the subscription's cursor and the client cannot read
  it, so ``committed`` is unknown and the runner resumes from the lane's coverage:
  ``seek`` sets a floor below which messages are acknowledged (they are durable) and
  dropped. That is also how redeliveries after a crash, a reconnect or a broker that
  dispatches twice are kept out of the lane: a position at or below one already handed
  over is never handed over again.
* **Assignment.** The client announces no partition assignment, so a partition is
  announced to the runner when its first message arrives (before that message is
  returned).

Flow control is the client's receiver queue: while the runner is paused nothing is
received, the queue fills and the broker stops dispatching.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import numpy as np
import pyarrow as pa
from pulsar.exceptions import PulsarException, Timeout

from thalweg.config.models import PulsarSourceConfig
from thalweg.errors import InvariantError, SourceError
from thalweg.group.owners import OwnerDirectory
from thalweg.pulsar.client import subscribe
from thalweg.records.columns import MetadataColumns
from thalweg.records.pulsar_batch import ReceivedIds, build_pulsar_raw_batch
from thalweg.sources.base import PartitionKey, RebalanceCallback, SourceFeatures

log = logging.getLogger(__name__)

CUMULATIVE_TYPES = frozenset({"exclusive", "failover"})
_PARTITION_RE = re.compile(r"^(.*)-partition-(\d+)$")


class PulsarSource:
    """One consumer on one subscription for the topics of one configured source."""

    # Packed message ids, redelivered out of order on shared subscriptions, and no
    # cheap log bounds: the log-continuity checks of Kafka do not apply (docs/pulsar.md).
    positions_are_offsets = False

    def __init__(
        self,
        cfg: PulsarSourceConfig,
        columns: MetadataColumns,
        owners: OwnerDirectory | None = None,
    ) -> None:
        # ``owners`` is not published: a Pulsar subscription announces no assignment to
        # the other consumers, so a Pulsar gateway serves what it holds.
        self.cfg = cfg
        self._columns = columns
        self._client: Any = None
        self._consumer: Any = None
        self._on_assigned: RebalanceCallback | None = None
        self._cumulative = cfg.subscription_type in CUMULATIVE_TYPES
        self._known: set[PartitionKey] = set()
        self._floor: dict[PartitionKey, int] = {}  # the lowest position still accepted
        self._acked: dict[PartitionKey, int] = {}  # everything below is durable
        # Per partition, what was received and not yet acknowledged: chunks of
        # (positions, message ids), one per fetched batch.
        self._unacked: dict[PartitionKey, list[tuple[np.ndarray[Any, Any], list[Any]]]] = {}
        # Received for a paused partition: (messages, their ids) per fetch, handed over
        # on resume.
        self._held: dict[PartitionKey, list[tuple[list[Any], ReceivedIds]]] = {}
        self._paused: set[PartitionKey] = set()
        self._keys: dict[str, PartitionKey] = {}
        # One topic named: a message's partition is in its id, and the key of each
        # partition number is learnt from the first message's topic name.
        self._one_topic = cfg.topics_pattern is None and len(cfg.topics) == 1
        self._by_partition: dict[int, PartitionKey] = {}

    def features(self) -> SourceFeatures:
        """None of the extras: no group session to expire, no DLQ topic, Pulsar creates
        topics on first use."""
        return SourceFeatures()

    # -- lifecycle -----------------------------------------------------------------

    async def start(self, on_assigned: RebalanceCallback, on_revoked: RebalanceCallback) -> None:
        """Connect and subscribe. ``on_revoked`` is never called: the client does not say
        when a failover subscription moves a partition away (docs/pulsar.md)."""
        self._on_assigned = on_assigned
        try:
            self._client, self._consumer = await asyncio.to_thread(subscribe, self.cfg)
        except PulsarException as exc:
            raise SourceError(
                f"source {self.cfg.name!r}: cannot subscribe at {self.cfg.service_url}: {exc}"
            ) from exc

    async def stop(self) -> None:
        """Close the consumer and the client (unacknowledged messages are redelivered
        to whoever subscribes next)."""
        consumer, client = self._consumer, self._client
        self._consumer = self._client = None
        if client is None:
            return

        def close() -> None:
            try:
                if consumer is not None:
                    consumer.close()
            finally:
                client.close()

        try:
            await asyncio.to_thread(close)
        except PulsarException as exc:
            log.warning("source %s: error while closing: %s", self.cfg.name, exc)

    @property
    def consumer(self) -> Any:
        if self._consumer is None:
            raise SourceError(f"source {self.cfg.name!r} is not started", retriable=False)
        return self._consumer

    # -- fetching ------------------------------------------------------------------

    def _receive(self, timeout_ms: int, max_records: int) -> list[Any]:
        """Up to ``max_records`` messages: waits up to ``timeout_ms`` for the first, then
        takes what the receiver queue already holds."""
        # The client's own (C++) consumer: its messages skip a Python wrapper frame on
        # every field read, which is most of the per-message cost.
        consumer = getattr(self.consumer, "_consumer", self.consumer)
        out: list[Any] = []
        deadline = time.monotonic() + timeout_ms / 1000
        wait_ms = timeout_ms
        while len(out) < max_records:
            try:
                out.append(consumer.receive(max(1, wait_ms)))
            except Timeout:
                break
            # Once something arrived, only drain what is queued (1 ms), until the deadline.
            wait_ms = 1 if time.monotonic() < deadline else 0
            if wait_ms == 0:
                break
        return out

    def lane_key(self, message: Any) -> PartitionKey:
        """``(lane topic, partition)`` of a message: the short topic name, and the
        partition index (0 for a topic that is not partitioned). Cached per topic name:
        it runs once per message."""
        name = message.topic_name()
        key = self._keys.get(name)
        if key is None:
            short = name
            if short.startswith(self.cfg.namespace_prefix):
                short = short[len(self.cfg.namespace_prefix) :]
            # Pulsar reserves the "-partition-<n>" suffix for the partitions of a topic.
            m = _PARTITION_RE.match(short)
            key = (m.group(1), int(m.group(2))) if m is not None else (short, 0)
            self._keys[name] = key
        return key

    def _lane_keys(self, messages: list[Any], ids: ReceivedIds) -> dict[PartitionKey, list[int]]:
        """The rows of ``messages`` per lane key, in arrival order. With one topic named,
        from the partition numbers in the ids (a topic name read per message was the
        largest cost after the ids themselves, load-tests/pulsar_profile.py)."""
        rows: dict[PartitionKey, list[int]] = {}
        if self._one_topic:
            numbers = ids.parts.partition
            for number in np.unique(numbers).tolist():
                hit = np.flatnonzero(numbers == number)
                key = self._by_partition.get(number)
                if key is None:
                    key = self._by_partition[number] = self.lane_key(messages[int(hit[0])])
                rows.setdefault(key, []).extend(hit.tolist())
            return rows
        for i, message in enumerate(messages):
            rows.setdefault(self.lane_key(message), []).append(i)
        return rows

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[PartitionKey, pa.RecordBatch]:
        """New messages as one raw-lane batch per partition, positions ascending;
        redeliveries of anything already handed over are left out."""
        grouped: dict[PartitionKey, list[tuple[list[Any], ReceivedIds]]] = {}
        for key in [k for k in self._held if k not in self._paused]:
            grouped[key] = self._held.pop(key)
        if self._known and self._known <= self._paused:
            # Everything is paused: receive nothing, so the broker stops dispatching.
            await asyncio.sleep(timeout_ms / 1000)
        else:
            try:
                received = await asyncio.to_thread(self._receive, timeout_ms, max_records)
            except PulsarException as exc:
                raise SourceError(f"source {self.cfg.name!r}: receive failed: {exc}") from exc
            if received:
                try:
                    ids = ReceivedIds.of(received)
                except ValueError as exc:  # the client's own bytes: not expected, not data
                    raise SourceError(
                        f"source {self.cfg.name!r}: unreadable message id: {exc}", retriable=False
                    ) from exc
                keyed = self._lane_keys(received, ids)
                for key, rows in keyed.items():
                    # One key (a topic without partitions, the common case): no copies.
                    whole = len(keyed) == 1
                    part = (
                        (received, ids) if whole else ([received[i] for i in rows], ids.take(rows))
                    )
                    if key in self._paused:
                        self._held.setdefault(key, []).append(part)
                    else:
                        grouped.setdefault(key, []).append(part)
        new = [k for k in grouped if k not in self._known]
        if new:
            self._known.update(new)
            if self._on_assigned is None:
                raise InvariantError("self._on_assigned is not set")
            await self._on_assigned(new)  # sets each partition's floor (seek) first
        ingest_ts_us = time.time_ns() // 1000
        out: dict[PartitionKey, pa.RecordBatch] = {}
        late: list[Any] = []
        for key, parts in grouped.items():
            messages = parts[0][0] if len(parts) == 1 else [m for p in parts for m in p[0]]
            key_ids = ReceivedIds.concat([p[1] for p in parts])
            raw = build_pulsar_raw_batch(
                messages,
                topic=key[0],
                partition=key[1],
                cluster=self.cfg.cluster_name,
                ingest_ts_us=ingest_ts_us,
                columns=self._columns,
                ids=key_ids,
            )
            fresh = self._admit(key, raw, key_ids.ids, late)
            if fresh.num_rows:
                out[key] = fresh
        if late:
            await self._ack(late, cumulative=False)
        return out

    def _admit(
        self, key: PartitionKey, raw: pa.RecordBatch, ids: list[Any], late: list[Any]
    ) -> pa.RecordBatch:
        """Keep each position above everything handed over before it; the rest are
        redeliveries (acknowledged at once when already durable, else with the segment
        that holds their first delivery)."""
        positions = raw.column(self._columns.position).to_numpy()
        floor = self._floor.get(key, -1)
        seen = np.maximum.accumulate(np.concatenate(([floor - 1], positions)))[:-1]
        keep = positions > seen
        durable = ~keep & (positions < self._acked.get(key, -1))
        if durable.any():
            late.extend(ids[i] for i in np.flatnonzero(durable))
            rest = np.flatnonzero(~durable)
            self._unacked.setdefault(key, []).append((positions[rest], [ids[i] for i in rest]))
        else:
            self._unacked.setdefault(key, []).append((positions, ids))
        if keep.any():
            self._floor[key] = int(positions[keep].max()) + 1
        return raw if keep.all() else raw.filter(pa.array(keep))

    # -- positions -----------------------------------------------------------------

    async def commit(self, positions: dict[PartitionKey, int]) -> None:
        """Acknowledge every message below each position (cumulatively for exclusive and
        failover subscriptions, one by one for shared and key_shared)."""
        ids: list[Any] = []
        for key, end in positions.items():
            kept = []
            best: tuple[int, Any] | None = None  # the highest position acknowledged
            for pos, chunk_ids in self._unacked.get(key, []):
                below = pos < end
                if not below.any():
                    kept.append((pos, chunk_ids))
                    continue
                if self._cumulative:
                    i = int(np.argmax(np.where(below, pos, -1)))
                    if best is None or pos[i] > best[0]:
                        best = (int(pos[i]), chunk_ids[i])
                else:
                    ids.extend(chunk_ids[i] for i in np.flatnonzero(below))
                if not below.all():
                    rest = np.flatnonzero(~below)
                    kept.append((pos[rest], [chunk_ids[i] for i in rest]))
            self._unacked[key] = kept
            if best is not None:
                ids.append(best[1])
            self._acked[key] = max(self._acked.get(key, -1), end)
        if ids:
            await self._ack(ids, cumulative=self._cumulative)

    async def _ack(self, ids: list[Any], *, cumulative: bool) -> None:
        consumer = self.consumer
        ack = consumer.acknowledge_cumulative if cumulative else consumer.acknowledge

        def send() -> None:
            for msg_id in ids:
                ack(msg_id)

        try:
            await asyncio.to_thread(send)
        except PulsarException as exc:
            # Not lost: unacknowledged messages come back and are dropped as redeliveries.
            raise SourceError(f"source {self.cfg.name!r}: acknowledge failed: {exc}") from exc

    async def committed(self, key: PartitionKey) -> int | None:
        """Unknown: the subscription's cursor lives in the broker, out of the client's
        reach. The runner resumes from the lane's coverage instead."""
        return None

    def seek(self, key: PartitionKey, position: int) -> None:
        """Hand over nothing below ``position`` (it is in the lane already)."""
        self._floor[key] = max(self._floor.get(key, -1), position)
        self._acked[key] = max(self._acked.get(key, -1), position)

    def pause(self, keys: list[PartitionKey]) -> None:
        self._paused.update(keys)

    def resume(self, keys: list[PartitionKey]) -> None:
        self._paused.difference_update(keys)

    def generation(self) -> int:
        """A subscription has no generation: 0 (object-store names carry it)."""
        return 0

    def membership(self) -> tuple[bool, float | None]:
        """Always a member: a Pulsar subscription has no group session to expire."""
        return True, None

    async def missing_topics(self) -> list[str]:
        """Pulsar creates topics on first use: none is ever missing."""
        return []

    async def log_start(self, key: PartitionKey) -> int:
        raise SourceError(f"source {self.cfg.name!r}: a Pulsar log start is not read")

    def ended(self) -> list[PartitionKey]:
        """A broker's partitions never end."""
        return []

    def highwater(self, key: PartitionKey) -> int | None:
        """Not known cheaply (it would take a ``get_last_message_id`` round trip)."""
        return None

    async def probe(self, timeout_s: float = 3.0) -> bool:
        """Whether the consumer holds a broker connection now."""
        consumer = self._consumer
        if consumer is None:
            return False
        task = asyncio.ensure_future(asyncio.to_thread(consumer.is_connected))
        done, _ = await asyncio.wait([task], timeout=timeout_s)
        if not done:
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            return False
        return task.exception() is None and bool(task.result())
