"""Kafka through aiokafka: a consumer-group member with explicit commits only.

Auto-commit is always off: the engine commits a position only after the raw lane covering
it is durable. Library errors are wrapped into :class:`SourceError` here, at the edge.

Its length: start (login, subscribe, the group's assignors), fetch, commit and the
broker's log bounds all drive the one consumer this class owns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, UnknownTopicOrPartitionError

from thalweg.config.models import KafkaSourceConfig
from thalweg.errors import LoginRefusedError, SourceError
from thalweg.group.owners import OwnerDirectory
from thalweg.kafka.assignor import owner_assignor
from thalweg.kafka.clients import new_consumer, security_kwargs
from thalweg.kafka.columnar_fetch import ColumnarFetch
from thalweg.kafka.dlq import DeadLetterTopic
from thalweg.kafka.hold import StaticHold
from thalweg.kafka.leave import leave_unless_leader
from thalweg.kafka.login import check_login, refusal
from thalweg.kafka.unpack import KafkaColumns
from thalweg.records.columns import MetadataColumns
from thalweg.records.raw_batch import PartitionColumns, raw_batches_from_columns
from thalweg.sources.base import (
    GroupSession,
    PartitionKey,
    RebalanceCallback,
    SourceFeatures,
)

log = logging.getLogger(__name__)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, on_assigned: RebalanceCallback, on_revoked: RebalanceCallback) -> None:
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        await self._on_revoked([(tp.topic, tp.partition) for tp in revoked])

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        await self._on_assigned([(tp.topic, tp.partition) for tp in assigned])


# How often a fetch looks again while the group rebalances, and how long past its own
# timeout a fetch may take before it is taken to be held by a rebalance.
REBALANCE_POLL_MS = 100
REBALANCE_SLACK_S = 1.0


class KafkaSource:
    """One consumer-group member for the topics of one configured source."""

    # Offsets of one partition only ever grow, and the broker can say where its log
    # starts and ends: the runner checks that the log still continues the lane.
    positions_are_offsets = True

    def __init__(
        self,
        cfg: KafkaSourceConfig,
        columns: MetadataColumns,
        owners: OwnerDirectory | None = None,
    ) -> None:
        self.cfg = cfg
        self._columns = columns
        self._owners = owners
        if owners is not None:
            owners.expect(None if cfg.topics_pattern is not None else cfg.topics)
        self._consumer: AIOKafkaConsumer | None = None
        self._led = (-1, 0)  # the generation this member led (assigned) and its members
        self._last_heartbeat_ok: float | None = None
        self._joined = False
        self._hold: StaticHold | None = None  # static membership's (thalweg.kafka.hold)
        # Fetched record batches come as columns (thalweg.kafka.unpack), not records.
        self._columnar = ColumnarFetch()

    def features(self) -> SourceFeatures:
        """A group session, the group, a DLQ topic when configured, topics the broker
        can say are missing, and ``on_divergence``."""
        cfg = self.cfg
        dead_letters = (
            DeadLetterTopic(
                cfg.dlq_bootstrap_servers or cfg.bootstrap_servers,
                cfg.dlq_topic,
                self._columns,
                **security_kwargs(cfg),
            )
            if cfg.dlq_topic
            else None
        )
        return SourceFeatures(
            session=GroupSession(cfg.session_timeout_ms, cfg.heartbeat_interval_ms),
            group_id=cfg.group_id,
            dead_letters=dead_letters,
            dead_letters_max_wait_s=cfg.dlq_topic_max_wait_s,
            missing_topic_grace_s=cfg.missing_topic_grace_s,
            new_epoch_on_divergence=cfg.on_divergence == "new_epoch",
            login_retry_max_s=cfg.login_retry_max_s,
        )

    @property
    def consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise SourceError(f"source {self.cfg.name!r} is not started", retriable=False)
        return self._consumer

    async def start(self, on_assigned: RebalanceCallback, on_revoked: RebalanceCallback) -> None:
        """Log in once (a refused login named: ``thalweg.kafka.login``), then connect and
        join the group; partitions arrive through ``on_assigned``."""
        await check_login(self.cfg)
        consumer = new_consumer(self.cfg, self._assignors(), value_deserializer=self._columnar)
        listener = _Listener(on_assigned, on_revoked)
        if self.cfg.topics_pattern is not None:
            # aiokafka's re.match anchors only the start: anchor the end as documented.
            consumer.subscribe(pattern=f"(?:{self.cfg.topics_pattern})\\Z", listener=listener)
        else:
            consumer.subscribe(self.cfg.topics, listener=listener)
        # Set before start(): the first assignment can arrive while start() still runs.
        self._consumer = consumer
        try:
            await consumer.start()
        except UnknownTopicOrPartitionError as exc:
            # aiokafka waits request_timeout_ms for every subscribed topic at start.
            known = await self._known_topics(consumer)
            self._consumer = None
            await consumer.stop()
            missing = [t for t in self.cfg.topics if known is None or t not in known]
            raise SourceError(
                f"source {self.cfg.name!r}: configured topic(s) not on the broker at "
                f"{self.cfg.bootstrap_servers}: {', '.join(missing)} (create them, or "
                "enable the broker's topic auto-creation); retrying"
            ) from exc
        except (KafkaError, LoginRefusedError, KeyError, ValueError) as exc:
            # KeyError and ValueError: aiokafka's SCRAM client on a refused login; the
            # check above catches that first unless the credential changed in between.
            self._consumer = None
            await consumer.stop()
            refused = refusal(self.cfg, self.cfg.bootstrap_servers, exc)
            if refused is not None:
                raise refused from exc
            if not isinstance(exc, KafkaError):
                raise
            raise SourceError(
                f"source {self.cfg.name!r}: cannot connect to {self.cfg.bootstrap_servers}: {exc}"
            ) from exc
        self._watch_heartbeats(consumer)

    def _assignors(self) -> tuple[Any, ...]:
        """The owner-map assignor alone (docs/lanes.md, "Many gateways"). Announcing a
        second protocol for groups with older members doubled the join on tansu (a
        second join round: 10 s instead of 5 s), so a group is all of one version."""
        if self._owners is None:
            return ()
        cfg = self.cfg
        if cfg.group_instance_id is None:
            return (owner_assignor(self._owners, self.generation, on_lead=self._on_lead),)
        self._hold = hold = StaticHold(cfg.static_hold_s(), self._rejoin)
        return (owner_assignor(self._owners, self.generation, by_location=True, hold=hold),)

    def _on_lead(self, members: int) -> None:
        self._led = (self.generation(), members)

    def _leads_others(self) -> bool:
        """Whether this member led the group's current generation with other members in
        it (it still leads a rebalance that started since: the broker keeps the leader
        until the next). A leader alone leaves: a restart of a lone gateway then joins
        at once, where waiting out the old member took over 60 s on noida."""
        generation, members = self._led
        return generation >= 0 and generation == self.generation() and members > 1

    def _rejoin(self) -> None:
        """Ask the group to rebalance: a held static member's grace ran out."""
        if (coordinator := getattr(self._consumer, "_coordinator", None)) is not None:
            coordinator.request_rejoin()

    def generation(self) -> int:
        """The member's consumer-group generation (-1 before it joined)."""
        generation = getattr(getattr(self._consumer, "_coordinator", None), "generation", -1)
        return generation if isinstance(generation, int) else -1

    @staticmethod
    async def _known_topics(consumer: AIOKafkaConsumer) -> set[str] | None:
        try:
            return set(await consumer.topics())
        except KafkaError:
            return None

    def _watch_heartbeats(self, consumer: AIOKafkaConsumer) -> None:
        """Note the time of every successful group heartbeat.

        aiokafka has no public hook for it; its coordinator's ``_do_heartbeat`` returns
        True on success. Without that method (another aiokafka), :meth:`membership`
        reports no heartbeats, and ownership doubts clear only at the next assignment.
        """
        coordinator = getattr(consumer, "_coordinator", None)
        beat = getattr(coordinator, "_do_heartbeat", None)
        if coordinator is None or beat is None:
            log.warning("source %s: cannot observe group heartbeats", self.cfg.name)
            return

        async def observed() -> Any:
            ok = await beat()
            if ok:
                self._last_heartbeat_ok = time.monotonic()
            return ok

        coordinator._do_heartbeat = observed

    def membership(self) -> tuple[bool, float | None]:
        """Whether the group still knows this member (as far as the client can tell),
        and the monotonic time of the last successful heartbeat."""
        coordinator = getattr(self._consumer, "_coordinator", None)
        generation = getattr(coordinator, "generation", -1)
        if isinstance(generation, int) and generation > 0:
            self._joined = True
        # Before the first join there is nothing to lose; after it, generation -1 means
        # the client reset its membership (unknown member, illegal generation).
        valid = not self._joined or (coordinator is not None and generation != -1)
        return valid, self._last_heartbeat_ok

    async def log_start(self, key: PartitionKey) -> int:
        """The broker's log start offset of a partition, asked now.

        Only the start: the log's end comes from fetch responses (:meth:`highwater`),
        which every broker tried reports right, while some (tansu) answer a
        ListOffsets(latest) with the last batch's base offset + 1.
        """
        tp = TopicPartition(*key)
        try:
            start = await self.consumer.beginning_offsets([tp])
        except KafkaError as exc:
            raise SourceError(f"source {self.cfg.name!r}: log start of {key}: {exc}") from exc
        return int(start[tp])

    def _rebalancing(self) -> bool:
        """Whether the group is reassigning partitions now (aiokafka's own flag; False if
        a release no longer has it: then a fetch may wait out a rebalance again)."""
        state = getattr(self.consumer, "_subscription", None)
        return bool(getattr(state, "reassignment_in_progress", False))

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[PartitionKey, pa.RecordBatch]:
        """Records fetched since the last call as one raw-lane batch per partition, in
        offset order; at most ``max_records`` of them (the rest stays for a later fetch)."""
        parts: dict[TopicPartition, list[KafkaColumns]] = {}
        remaining, wait = max_records, timeout_ms
        if self._rebalancing():
            # aiokafka's getmany waits out a rebalance with no timeout (it withholds
            # records until the new assignment): the loop would not see a stop, nor beat
            # /health, until the group settles (soak, session 22: a SIGTERM during a long
            # rebalance ran past the shutdown deadline). Nothing is fetched meanwhile.
            await asyncio.sleep(min(wait, REBALANCE_POLL_MS) / 1000)
            return {}
        while remaining > 0:
            # One record batch (or the part of one the budget allows) a call: the rest
            # stays in aiokafka's buffer for the next call, never fetched twice.
            self._columnar.remaining = remaining
            try:
                if wait:
                    # Bounded: a rebalance that begins while getmany waits for data holds
                    # it the same way. (The calls after it take what is buffered, without
                    # waiting; the check above each keeps them out of a rebalance.)
                    data = await asyncio.wait_for(
                        self.consumer.getmany(timeout_ms=wait, max_records=1),
                        wait / 1000 + REBALANCE_SLACK_S,
                    )
                elif self._rebalancing():
                    break
                else:
                    data = await self.consumer.getmany(timeout_ms=0, max_records=1)
            except TimeoutError:
                break  # a rebalance: what came so far is handed over, the loop goes on
            except KafkaError as exc:
                raise SourceError(f"source {self.cfg.name!r}: fetch failed: {exc}") from exc
            got = [(tp, c) for tp, chunks in data.items() for c in chunks if len(c)]
            if not got:
                break
            for tp, c in got:
                parts.setdefault(tp, []).append(c)
                remaining -= len(c)
            wait = 0
        if not parts:
            return {}
        columns = []
        for tp, chunks in parts.items():
            cols = KafkaColumns.concat(chunks)
            columns.append(
                PartitionColumns(
                    tp.topic,
                    tp.partition,
                    cols.offsets,
                    cols.timestamps,
                    cols.timestamp_types,
                    cols.keys,
                    cols.values,
                    cols.headers,
                )
            )
        batches = raw_batches_from_columns(
            columns,
            cluster=self.cfg.cluster_name,
            ingest_ts_us=time.time_ns() // 1000,
            columns=self._columns,
        )
        return {(c.topic, c.partition): b for c, b in zip(columns, batches, strict=True)}

    async def probe(self, timeout_s: float = 3.0) -> bool:
        """Whether a broker answers a metadata request now.

        aiokafka's fetch returns nothing, not an error, while every broker is away, so
        the runner asks this to tell "no new records" from "no broker" for /ready.
        """
        # Not wait_for: aiokafka's metadata call can take its time honouring a cancel,
        # and wait_for would wait for that too. A late answer is simply dropped.
        task = asyncio.ensure_future(self.consumer.topics())
        done, _ = await asyncio.wait([task], timeout=timeout_s)
        if not done:
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            return False
        return task.exception() is None

    async def missing_topics(self) -> list[str]:
        """The configured topics the broker's metadata does not list."""
        try:
            known = await self.consumer.topics()
        except KafkaError as exc:
            raise SourceError(f"source {self.cfg.name!r}: metadata failed: {exc}") from exc
        return [t for t in self.cfg.topics if t not in known]

    def ended(self) -> list[PartitionKey]:
        """A broker's partitions never end."""
        return []

    def highwater(self, key: PartitionKey) -> int | None:
        """The broker's end of a partition as of the last fetch (None before one, or
        when the partition is no longer assigned)."""
        if self._consumer is None:
            return None
        tp = TopicPartition(*key)
        if tp not in self._consumer.assignment():
            return None
        hw = self._consumer.highwater(tp)
        return int(hw) if hw is not None else None

    def _assigned(self, keys: list[PartitionKey]) -> list[TopicPartition]:
        """``keys`` the consumer still has assigned.

        The engine's partitions follow the rebalance callbacks, but a pattern
        subscription that gains a topic drops aiokafka's assignment at once and calls
        the revoke callback later: in between, aiokafka asserts on (``highwater``) or
        refuses (``seek``, ``pause``) a partition the engine still holds. Such a
        partition is left alone; its revocation is on its way.
        """
        assigned = self.consumer.assignment()
        return [tp for tp in (TopicPartition(*k) for k in keys) if tp in assigned]

    async def commit(self, positions: dict[PartitionKey, int]) -> None:
        """Commit ``positions`` (the next offset to read) for the group."""
        try:
            await self.consumer.commit(
                {TopicPartition(t, p): off for (t, p), off in positions.items()}
            )
        except KafkaError as exc:
            raise SourceError(f"source {self.cfg.name!r}: commit failed: {exc}") from exc

    async def committed(self, key: PartitionKey) -> int | None:
        try:
            value = await self.consumer.committed(TopicPartition(*key))
        except KafkaError as exc:
            raise SourceError(f"source {self.cfg.name!r}: committed() failed: {exc}") from exc
        return None if value is None or value < 0 else int(value)

    def seek(self, key: PartitionKey, offset: int) -> None:
        for tp in self._assigned([key]):
            self.consumer.seek(tp, offset)

    def pause(self, keys: list[PartitionKey]) -> None:
        self.consumer.pause(*self._assigned(keys))

    def resume(self, keys: list[PartitionKey]) -> None:
        self.consumer.resume(*self._assigned(keys))

    async def stop(self) -> None:
        """Leave the group and close connections."""
        if self._hold is not None:
            self._hold.cancel()
        consumer = self._consumer
        if consumer is not None:
            cfg = self.cfg
            # (A static member never leaves; the owner map's assignor says who leads.)
            dynamic = self._owners is not None and cfg.group_instance_id is None
            if dynamic and cfg.leave_group_on_stop == "unless_leader":
                leave_unless_leader(consumer, self._leads_others, cfg.name)
            # Keep the reference until stop() returns: a rebalance callback may still be
            # running (a stop during start-up) and asks the consumer for committed offsets.
            # Bounded: a stop that lands mid-rebalance can wait on a JoinGroup the broker
            # holds until the rebalance completes (soak, session 22: past the 25 s
            # shutdown deadline). Everything durable is committed before this; a member
            # that does not leave is removed when its session times out.
            bound = max(1.0, self.cfg.session_timeout_ms / 1000)
            try:
                await asyncio.wait_for(consumer.stop(), bound)
            except TimeoutError:
                log.warning(
                    "source %s: leaving the group took over %gs (a rebalance in progress?); "
                    "the group drops this member when its session times out",
                    self.cfg.name,
                    bound,
                )
            except KafkaError as exc:  # leaving is best effort: the session times out
                log.warning("source %s: error while leaving the group: %s", self.cfg.name, exc)
            finally:
                self._consumer = None
