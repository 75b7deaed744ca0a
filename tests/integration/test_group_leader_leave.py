"""A group's leader that stops mid-rebalance must not strand the group (``kafka/leave``).

tansu keeps a member that sends LeaveGroup during a rebalance as the group's leader when
it led: every later JoinGroup names it, every SyncGroup answers REBALANCE_IN_PROGRESS,
and the group is never assigned again (soak, session 27: three minutes without an
assignment after a SIGTERM of the leader). The first test pins that broker behaviour
down on the raw group protocol — should it fail, tansu was fixed and
``leave_group_on_stop``'s default can go back to ``"always"``. The second stops a real
source that leads the group in the middle of a rebalance and sees the member left behind
take every partition once the leader's session has run out.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka.client import AIOKafkaClient, ConnectionGroup
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.protocol.group import JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest

from thalweg.config.models import KafkaSourceConfig
from thalweg.embedded import TansuBroker
from thalweg.group.owners import OwnerDirectory
from thalweg.kafka.assignor import PROTOCOL
from thalweg.records import MetadataColumns
from thalweg.sources.base import PartitionKey
from thalweg.sources.kafka import KafkaSource

pytestmark = pytest.mark.integration

PARTITIONS = 12
SESSION_MS = 2000
MEMBER_ID_REQUIRED = 79
REBALANCE_IN_PROGRESS = 27


class RawMember:
    """A group member speaking the group protocol itself: each step when the test says."""

    def __init__(self, bootstrap: str, group: str, topic: str, protocol: str) -> None:
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.protocol = protocol
        self.member_id, self.generation = "", -1
        self.meta = ConsumerProtocolMemberMetadata(0, [topic], b"").encode()

    async def start(self) -> None:
        self.client = AIOKafkaClient(bootstrap_servers=self.bootstrap)
        await self.client.bootstrap()
        self.node = await self.client.coordinator_lookup(0, self.group)

    async def send(self, request: Any) -> Any:
        return await self.client.send(self.node, request, group=ConnectionGroup.COORDINATION)

    def join_request(self) -> Any:
        return JoinGroupRequest(
            self.group, SESSION_MS, SESSION_MS, self.member_id, None, "consumer",
            [(self.protocol, self.meta)],
        )  # fmt: skip

    async def ask_member_id(self) -> None:
        """The first half of a join: the broker hands out a member id (and rebalances)."""
        response = await self.send(self.join_request())
        assert response.error_code == MEMBER_ID_REQUIRED, response
        self.member_id = response.member_id

    async def join(self) -> Any:
        if not self.member_id:
            await self.ask_member_id()
        response = await self.send(self.join_request())
        assert response.error_code == 0, response
        self.generation = response.generation_id
        return response

    async def sync(self, leader: bool) -> int:
        everyone = [self.member_id]
        mine = ConsumerProtocolMemberAssignment(0, [(self.topic, list(range(PARTITIONS)))], b"")
        given = [(m, mine.encode()) for m in everyone] if leader else []
        request = SyncGroupRequest(self.group, self.generation, self.member_id, None, given)
        return int((await self.send(request)).error_code)

    async def leave(self) -> None:
        response = await self.send(LeaveGroupRequest(self.group, self.member_id))
        assert response.error_code == 0, response

    async def close(self) -> None:
        await self.client.close()


async def test_tansu_keeps_a_leader_that_leaves_mid_rebalance(
    broker: TansuBroker, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(PARTITIONS)
    group = f"leave-{uuid.uuid4().hex[:8]}"
    a, b = (RawMember(broker.bootstrap, group, topic, "roundrobin") for _ in range(2))
    await a.start()
    await b.start()
    try:
        joined = await a.join()
        assert joined.leader_id == a.member_id
        assert await a.sync(leader=True) == 0
        await b.ask_member_id()  # a second member: the group rebalances
        await a.leave()  # the leader leaves mid-rebalance
        deadline = time.monotonic() + 3 * SESSION_MS / 1000  # well past any session
        while time.monotonic() < deadline:
            again = await b.join()
            assert again.leader_id == a.member_id, (
                "tansu no longer keeps a leader that left mid-rebalance: "
                "leave_group_on_stop's default can go back to 'always'"
            )
            assert await b.sync(leader=False) == REBALANCE_IN_PROGRESS
    finally:
        await a.close()
        await b.close()


class Pair:
    """Two sources of one group, each with the partitions it holds."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        cfg = KafkaSourceConfig(
            name="s", bootstrap_servers=bootstrap, topics=[topic], group_id=group,
            session_timeout_ms=SESSION_MS, heartbeat_interval_ms=400,
        )  # fmt: skip
        assert cfg.leave_group_on_stop == "unless_leader"  # the default
        self.sources = [KafkaSource(cfg, MetadataColumns(), OwnerDirectory()) for _ in "ab"]
        self.held: list[set[PartitionKey]] = [set(), set()]

    async def start(self) -> int:
        """Both in one generation past the first (aiokafka leaves only past generation
        0); the index of the one that leads it."""
        for i, source in enumerate(self.sources):
            await source.start(*self._callbacks(i))
        a, b = self.sources
        await wait_for(
            lambda: (
                a.generation() == b.generation() >= 1
                and len(self.held[0]) + len(self.held[1]) == PARTITIONS
                and (a._leads_others() or b._leads_others())
            ),
            "both sources in one generation",
        )
        return 0 if a._leads_others() else 1

    def _callbacks(self, i: int) -> tuple[Any, Any]:
        async def assigned(keys: list[PartitionKey]) -> None:
            self.held[i].update(keys)

        async def revoked(keys: list[PartitionKey]) -> None:
            self.held[i].difference_update(keys)

        return assigned, revoked

    async def stop(self) -> None:
        for source in self.sources:
            await source.stop()


async def test_a_leader_stopping_mid_rebalance_leaves_the_group_to_the_others(
    broker: TansuBroker, topic_factory: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "thalweg.kafka.leave")
    topic = topic_factory(PARTITIONS)
    group = f"leave-{uuid.uuid4().hex[:8]}"
    pair = Pair(broker.bootstrap, topic, group)
    sources, held = pair.sources, pair.held
    newcomer = RawMember(broker.bootstrap, group, topic, PROTOCOL)
    await newcomer.start()
    try:
        leader = await pair.start()
        other = 1 - leader
        await newcomer.ask_member_id()  # a rebalance starts; the leader has not seen it
        await sources[leader].stop()
        assert "not leaving the group as its leader" in caplog.text
        # The newcomer never joins again and times out; so does the silent leader. The
        # member left behind then leads and takes every partition.
        await wait_for(
            lambda: len(held[other]) == PARTITIONS,
            f"the remaining member holding every partition (holds {held[other]})",
            timeout=30,
        )
    finally:
        await pair.stop()
        await newcomer.close()


async def test_a_member_that_does_not_lead_and_a_lone_leader_leave_at_once(
    broker: TansuBroker, topic_factory: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    """Only a leader with others waits out its session: any other member hands its
    partitions over as it stops, and so does a leader left alone (a lone gateway's
    restart joins at once)."""
    caplog.set_level(logging.INFO, "aiokafka.consumer.group_coordinator")
    pair = Pair(broker.bootstrap, topic_factory(PARTITIONS), f"leave-{uuid.uuid4().hex[:8]}")
    try:
        leader = await pair.start()
        follower = 1 - leader
        await pair.sources[follower].stop()
        assert caplog.text.count("LeaveGroup request succeeded") == 1
        alone = pair.sources[leader]
        await wait_for(lambda: len(pair.held[leader]) == PARTITIONS, "the leader alone")
        assert not alone._leads_others()
        await alone.stop()
        assert caplog.text.count("LeaveGroup request succeeded") == 2
    finally:
        await pair.stop()


async def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        await asyncio.sleep(0.1)
