"""A departed static member's partitions are held for it for a bounded time
(thalweg.kafka.hold): its return moves nothing; past the grace a rebalance is asked for
and the split hands them to the members present."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from tests.unit.group.test_owners import Partitions, member
from thalweg.config.models import KafkaSourceConfig
from thalweg.group.owners import OwnerDirectory
from thalweg.kafka import hold as hold_module
from thalweg.kafka.assignor import owner_assignor
from thalweg.kafka.hold import StaticHold

A, B, C = "grpc://a:1", "grpc://b:2", "grpc://c:3"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def split_of(out: dict, ids: dict[str, str]) -> dict[str, dict[str, list[int]]]:  # type: ignore[type-arg]
    return {loc: dict(out[i].assignment) for i, loc in ids.items() if i in out}


def test_an_absent_static_owner_keeps_its_partitions_until_its_grace_runs_out() -> None:
    clock = Clock()
    hold = StaticHold(8.0, clock=clock)
    directory = OwnerDirectory()
    assignor = owner_assignor(directory, lambda: 1, by_location=True, hold=hold)
    cluster = Partitions({"t": 6})
    three = {"m-a": A, "m-b": B, "m-c": C}
    out = assignor.assign(cluster, {i: member(loc, ["t"]) for i, loc in three.items()})  # type: ignore[arg-type]
    full = split_of(out, three)
    assert full == {A: {"t": [0, 3]}, B: {"t": [1, 4]}, C: {"t": [2, 5]}}
    assignor.on_assignment(out["m-a"])
    before = directory.owners()

    # b restarts; the broker forms a generation of a and c alone.
    clock.now += 3
    two = {"m-a": A, "m-c": C}
    out = assignor.assign(cluster, {i: member(loc, ["t"]) for i, loc in two.items()})  # type: ignore[arg-type]
    assert set(out) == {"m-a", "m-c"}  # no stand-in is sent an assignment
    assert split_of(out, two) == {A: {"t": [0, 3]}, C: {"t": [2, 5]}}  # nothing moved
    body = json.loads(out["m-a"].user_data)
    assert body["held"] == {B: clock.now}
    assignor.on_assignment(out["m-a"])
    assert directory.owners() == before  # readers are still sent to b for 1 and 4
    assert directory.snapshot()["held"] == {B: clock.now}  # shown in /stats
    assert hold.expired() == []

    # b returns within its grace: it gets exactly its own partitions, nothing is held.
    clock.now += 5
    out = assignor.assign(cluster, {i: member(loc, ["t"]) for i, loc in three.items()})  # type: ignore[arg-type]
    assert split_of(out, three) == full
    assert "held" not in json.loads(out["m-a"].user_data)
    assignor.on_assignment(out["m-a"])
    assert hold.expired() == []

    # b leaves for good: held for the grace, then handed to a and c.
    clock.now += 1
    out = assignor.assign(cluster, {i: member(loc, ["t"]) for i, loc in two.items()})  # type: ignore[arg-type]
    assignor.on_assignment(out["m-a"])
    assert split_of(out, two) == {A: {"t": [0, 3]}, C: {"t": [2, 5]}}
    clock.now += 7.9
    assert hold.expired() == []
    clock.now += 0.2
    assert hold.expired() == [B]  # the rebalance is asked for now
    # ... with join metadata that differs, or a broker answers with the stored assignment.
    assert json.loads(assignor.metadata(["t"]).user_data)["release"] == [B]
    out = assignor.assign(cluster, {i: member(loc, ["t"]) for i, loc in two.items()})  # type: ignore[arg-type]
    assert split_of(out, two) == {A: {"t": [0, 2, 4]}, C: {"t": [1, 3, 5]}}
    assert "held" not in json.loads(out["m-a"].user_data)
    assignor.on_assignment(out["m-a"])
    assert set(directory.owners()["t"].values()) == {A, C}
    assert hold.expired() == []
    assert "release" not in json.loads(assignor.metadata(["t"]).user_data)


def test_a_new_leader_keeps_the_first_leaders_clock_and_no_hold_without_a_grace() -> None:
    clock = Clock()
    first, second = StaticHold(8.0, clock=clock), StaticHold(8.0, clock=clock)
    cluster = Partitions({"t": 4})
    dir_a, dir_c = OwnerDirectory(), OwnerDirectory()
    leader_a = owner_assignor(dir_a, lambda: 1, by_location=True, hold=first)
    member_c = owner_assignor(dir_c, lambda: 1, by_location=True, hold=second)
    three = {"m-a": member(A, ["t"]), "m-b": member(B, ["t"]), "m-c": member(C, ["t"])}
    out = leader_a.assign(cluster, three)  # type: ignore[arg-type]
    leader_a.on_assignment(out["m-a"])
    member_c.on_assignment(out["m-c"])
    out = leader_a.assign(cluster, {"m-a": three["m-a"], "m-c": three["m-c"]})  # type: ignore[arg-type]
    member_c.on_assignment(out["m-c"])  # c learns b is held since now
    since = clock.now
    # a dies too; c leads 6 s later: b's grace still counts from the first leader's clock.
    clock.now += 6
    out = member_c.assign(cluster, {"m-c": three["m-c"]})  # type: ignore[arg-type]
    assert json.loads(out["m-c"].user_data)["held"] == {A: clock.now, B: since}
    clock.now += 2.5
    out = member_c.assign(cluster, {"m-c": three["m-c"]})  # type: ignore[arg-type]
    assert json.loads(out["m-c"].user_data)["held"] == {A: clock.now - 2.5}  # b's ran out
    # The split is over c and a's stand-in now: c gets 1 and 3 (two members' worth).
    assert dict(out["m-c"].assignment) == {"t": [1, 3]}

    none = owner_assignor(OwnerDirectory(), lambda: 1, by_location=True, hold=StaticHold(0))
    none.on_assignment(out["m-c"])
    out = none.assign(cluster, {"m-c": three["m-c"]})  # type: ignore[arg-type]
    assert dict(out["m-c"].assignment) == {"t": [0, 1, 2, 3]}


def test_a_clock_from_an_earlier_absence_does_not_cut_a_later_hold_short() -> None:
    """A member that learned a hold which then ended (the owner came back) keeps no
    clock for it: when it leads at that owner's next absence, the grace starts anew."""
    clock = Clock()
    cluster = Partitions({"t": 3})
    three = {"m-a": member(A, ["t"]), "m-b": member(B, ["t"]), "m-c": member(C, ["t"])}
    lead_b = owner_assignor(
        OwnerDirectory(), lambda: 1, by_location=True, hold=StaticHold(8.0, clock=clock)
    )
    dir_c = OwnerDirectory()
    c = owner_assignor(dir_c, lambda: 1, by_location=True, hold=StaticHold(8.0, clock=clock))
    c.on_assignment(lead_b.assign(cluster, three)["m-c"])  # type: ignore[arg-type]
    c.on_assignment(lead_b.assign(cluster, {k: three[k] for k in ("m-b", "m-c")})["m-c"])  # type: ignore[arg-type]
    clock.now += 3
    c.on_assignment(lead_b.assign(cluster, three)["m-c"])  # type: ignore[arg-type]  # a back
    clock.now += 600  # a later rolling restart; c leads now
    out = c.assign(cluster, {k: three[k] for k in ("m-b", "m-c")})  # type: ignore[arg-type]
    assert json.loads(out["m-c"].user_data)["held"] == {A: clock.now}
    assert dict(out["m-c"].assignment) == {"t": [2]}


def test_the_leader_releases_what_any_member_says_is_spent() -> None:
    """A member whose clock runs ahead rejoins naming the hold spent: the leader hands
    the partitions over then, rather than hold them and be asked again and again."""
    clock = Clock()
    cluster = Partitions({"t": 3})
    leader = owner_assignor(
        OwnerDirectory(), lambda: 1, by_location=True, hold=StaticHold(8.0, clock=clock)
    )
    three = {"m-a": member(A, ["t"]), "m-b": member(B, ["t"]), "m-c": member(C, ["t"])}
    leader.on_assignment(leader.assign(cluster, three)["m-a"])  # type: ignore[arg-type]
    two = {"m-a": three["m-a"], "m-c": three["m-c"]}
    assert "held" in json.loads(leader.assign(cluster, two)["m-a"].user_data)  # type: ignore[arg-type]
    ahead = ConsumerProtocolMemberMetadata(
        0, ["t"], json.dumps({"location": C, "release": [B]}).encode()
    )
    out = leader.assign(cluster, {"m-a": three["m-a"], "m-c": ahead})  # type: ignore[arg-type]
    assert "held" not in json.loads(out["m-a"].user_data)
    assert dict(out["m-a"].assignment) == {"t": [0, 2]} and dict(out["m-c"].assignment) == {
        "t": [1]
    }


def test_a_spent_hold_still_in_the_map_asks_again_but_not_in_a_tight_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rebalance request can be lost, so one still held asks again — at most every
    ``REJOIN_EVERY_S``, however often the map repeats it."""
    monkeypatch.setattr(hold_module, "REJOIN_EVERY_S", 0.5)

    async def run() -> list[float]:
        asked: list[float] = []
        loop = asyncio.get_running_loop()
        hold = StaticHold(0.1, lambda: asked.append(loop.time()))
        since, start = hold._clock(), loop.time()
        while len(asked) < 3 and loop.time() - start < 10:
            hold.learn({B: since})  # the map keeps holding it (a request lost)
            await asyncio.sleep(0.05)
        hold.cancel()
        return asked

    asked = asyncio.run(run())
    assert len(asked) == 3
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert min(gaps) >= 0.5 - 0.01, gaps


def test_the_rebalance_is_asked_for_once_a_grace_runs_out_and_not_after_a_return() -> None:
    async def run() -> tuple[int, int]:
        calls: list[int] = []
        hold = StaticHold(0.3, lambda: calls.append(1))
        hold.learn({B: hold._clock()})
        await asyncio.sleep(0.8)
        gone = len(calls)
        back = StaticHold(0.3, lambda: calls.append(1))
        back.learn({B: back._clock()})
        back.learn({})  # the next map holds nothing: b came back
        await asyncio.sleep(0.8)
        return gone, len(calls) - gone

    assert asyncio.run(run()) == (1, 0)


def test_the_hold_defaults_to_the_session_but_never_below_a_join_round() -> None:
    def cfg(**kw: int) -> KafkaSourceConfig:
        return KafkaSourceConfig(
            name="s", bootstrap_servers="127.0.0.1:1", topics=["t"], group_instance_id="a", **kw
        )

    assert cfg().static_hold_s() == 30.0  # the 10 s session is shorter than tansu's rounds
    assert cfg(session_timeout_ms=45_000).static_hold_s() == 45.0
    assert cfg(session_timeout_ms=45_000, static_hold_ms=0).static_hold_s() == 0.0
    assert cfg(static_hold_ms=5_000).static_hold_s() == 5.0
