"""The owner map: what the group assignor hands every member, what the directory says
about each partition, the ranges a data_dir records as held elsewhere, and how the
client reads a gateway's relocation."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from tests.unit.lane.test_lane import COLS
from thalweg.errors import TicketError
from thalweg.flight.read.plan import plan_read
from thalweg.flight.read.tickets import parse_ticket
from thalweg.group.owners import OwnerDirectory
from thalweg.kafka.assignor import PROTOCOL, owner_assignor
from thalweg.lane.layout import LaneLayout
from thalweg.lane.read.catalog import Ingesting, LaneCatalog
from thalweg.lane.read.elsewhere import first_gap, held_elsewhere, record_elsewhere
from thalweg.lane.read.live import LiveTail
from thalweg_client.spread import fit, position_column, relocation


class Partitions:
    """The one question the assignor asks of cluster metadata."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.counts.get(topic)
        return set(range(n)) if n is not None else None


def member(location: str | None, topics: list[str]) -> ConsumerProtocolMemberMetadata:
    return ConsumerProtocolMemberMetadata(0, topics, json.dumps({"location": location}).encode())


def test_every_member_gets_the_whole_map_and_its_round_robin_share() -> None:
    directory = OwnerDirectory()
    directory.location = "grpc://a:1"
    assignor = owner_assignor(directory, lambda: 7)
    assert assignor.name == PROTOCOL
    mine = assignor.metadata(["t"])
    assert json.loads(mine.user_data) == {"v": 1, "location": "grpc://a:1"}

    members = {"m-a": member("grpc://a:1", ["t"]), "m-b": member("grpc://b:2", ["t"])}
    out = assignor.assign(Partitions({"t": 4}), members)  # type: ignore[arg-type]
    assert dict(out["m-a"].assignment) == {"t": [0, 2]}
    assert dict(out["m-b"].assignment) == {"t": [1, 3]}
    assert out["m-a"].user_data == out["m-b"].user_data
    owners = json.loads(out["m-a"].user_data)["owners"]
    assert owners == {
        "t": {"0": "grpc://a:1", "1": "grpc://b:2", "2": "grpc://a:1", "3": "grpc://b:2"}
    }

    assert not directory.active
    assignor.on_assignment(out["m-a"])
    assert directory.active
    assert directory.snapshot()["generation"] == 7
    assert directory.partitions("t") == [0, 1, 2, 3]
    assert directory.owned_elsewhere("t", 0) is None  # this member's
    assert directory.owned_elsewhere("t", 1) == "grpc://b:2"
    assert directory.owned_elsewhere("t", 9) is None  # nobody's known
    assert directory.owned_elsewhere("other", 0) is None


def test_the_split_follows_locations_not_member_ids_so_a_restart_gets_its_share_back() -> None:
    """A broker draws a new member id at every join; ordering by it moved partitions at
    each restart (tansu rebalances even a returning static member). By location, the
    same gateways always get the same partitions, over several topics too."""
    assignor = owner_assignor(OwnerDirectory(), lambda: 1, by_location=True)
    cluster = Partitions({"t": 6, "u": 3})
    locs = ["grpc://a:1", "grpc://b:2", "grpc://c:3"]

    def split(ids: list[str]) -> dict[str, dict[str, list[int]]]:
        members = {i: member(loc, ["t", "u"]) for i, loc in zip(ids, locs, strict=True)}
        out = assignor.assign(cluster, members)  # type: ignore[arg-type]
        return {loc: dict(out[i].assignment) for i, loc in zip(ids, locs, strict=True)}

    first = split(["m-1", "m-2", "m-3"])
    assert first == {
        "grpc://a:1": {"t": [0, 3], "u": [0]},
        "grpc://b:2": {"t": [1, 4], "u": [1]},
        "grpc://c:3": {"t": [2, 5], "u": [2]},
    }
    # Each member restarted in turn, with new ids sorting every other way.
    assert split(["z-9", "m-2", "m-3"]) == first
    assert split(["z-9", "a-0", "m-3"]) == first
    assert split(["z-9", "a-0", "b-5"]) == first
    # Without static membership the split is aiokafka's: by member id.
    by_id = owner_assignor(OwnerDirectory(), lambda: 1)
    members = {i: member(loc, ["t"]) for i, loc in zip(["z-9", "a-0", "b-5"], locs, strict=True)}
    out = by_id.assign(Partitions({"t": 3}), members)  # type: ignore[arg-type]
    assert {i: dict(out[i].assignment) for i in members} == {
        "a-0": {"t": [0]}, "b-5": {"t": [1]}, "z-9": {"t": [2]},
    }  # fmt: skip


def test_a_member_without_a_location_and_a_map_without_owners() -> None:
    directory = OwnerDirectory()
    directory.location = "grpc://a:1"
    assignor = owner_assignor(directory, lambda: 1)
    members = {"m-a": member("grpc://a:1", ["t"]), "m-b": member(None, ["t"])}
    out = assignor.assign(Partitions({"t": 2}), members)  # type: ignore[arg-type]
    assignor.on_assignment(out["m-a"])
    # The other member advertises nothing: reads of its partition cannot be sent there.
    assert directory.owner("t", 1) is None
    assert directory.owned_elsewhere("t", 1) is None

    fresh = OwnerDirectory()
    bare = owner_assignor(fresh, lambda: 1)
    plain = ConsumerProtocolMemberAssignment(0, [("t", [0])], b"not json")
    bare.on_assignment(plain)
    assert not fresh.active  # an assignment from another assignor publishes nothing


def test_inactive_directory_serves_everything_here() -> None:
    directory = OwnerDirectory()
    directory.location = "grpc://a:1"
    assert directory.owned_elsewhere("t", 0) is None
    published: list[int] = []
    d2 = OwnerDirectory(on_publish=lambda d: published.append(len(d.owners())))
    d2.publish(3, {"t": {0: "grpc://x:1"}, "u": {0: None}})
    assert published == [2]
    assert d2.owned_elsewhere("t", 0) == "grpc://x:1"


def test_ranges_held_elsewhere_are_durable_and_refuse_overlapping_reads(tmp_path: Path) -> None:
    layout = LaneLayout(tmp_path)
    assert held_elsewhere(layout, "t", 0) == []
    record_elsewhere(layout, "t", 0, 100, 500)
    record_elsewhere(layout, "t", 0, 100, 500)  # noted once
    record_elsewhere(layout, "t", 0, 700, 700)  # empty: nothing to note
    record_elsewhere(layout, "t", 0, 0, 50)
    assert held_elsewhere(LaneLayout(tmp_path), "t", 0) == [(0, 50), (100, 500)]
    assert first_gap(layout, "t", 0, 50, 100) is None
    assert first_gap(layout, "t", 0, 60, None) == (100, 500)
    assert first_gap(layout, "t", 0, 499, 501) == (100, 500)
    assert first_gap(layout, "t", 0, 500, None) is None
    assert first_gap(layout, "t", 1, 0, None) is None


def test_the_client_reads_a_relocation_and_fits_batches() -> None:
    detail = {"relocate": {"topic": "t", "owner": "grpc://b:2", "positions": {"1": 40}}}
    moved = fl.FlightUnavailableError("moved", json.dumps(detail).encode())
    assert relocation(moved) == {1: 40}
    assert relocation(fl.FlightUnavailableError("gone")) is None
    assert relocation(fl.FlightUnavailableError("x", b"{not json")) is None

    schema = pa.schema([("a", pa.int64()), ("_twg_source_partition", pa.int32()),
                        ("_twg_position", pa.int64()), ("b", pa.string())])  # fmt: skip
    assert position_column(schema) == "_twg_position"
    assert position_column(pa.schema([("_twg_position", pa.int64())])) is None
    batch = pa.record_batch({"a": [1, 2], "_twg_position": [5, 6], "c": [0.5, 1.5]})
    fitted = fit(batch, schema)
    assert fitted.schema == schema
    assert fitted.column("a").to_pylist() == [1, 2]
    assert fitted.column("b").null_count == 2


@pytest.mark.parametrize("raw", [b"", b"[]", b'{"owners": 3}', b'{"owners": {"t": 1}}'])
def test_malformed_maps_publish_nothing(raw: bytes) -> None:
    directory = OwnerDirectory()
    assignor = owner_assignor(directory, lambda: 1)
    assignor.on_assignment(ConsumerProtocolMemberAssignment(0, [], raw))
    assert not directory.active


class _Member(Ingesting):
    """What the gateway tells its catalog of the group (engine/gateway.py's adapter)."""

    def __init__(self, owners: OwnerDirectory) -> None:
        self.owners = owners

    def configured_topics(self) -> list[str]:
        return ["t", "other"]

    def group_partitions(self, topic: str) -> list[int]:
        return self.owners.partitions(topic)

    def awaiting_assignment(self, topic: str) -> bool:
        return self.owners.awaiting(topic)


def _plan(catalog: LaneCatalog, topic: str, partition: int) -> None:
    body = {"topic": topic, "lane": "raw", "partitions": [partition], "end": "follow"}
    plan_read(catalog, parse_ticket(json.dumps(body).encode()))


def test_a_member_whose_assignment_has_not_arrived_says_retry_not_no_such_partition(
    tmp_path: Path,
) -> None:
    """Restarted into a running group, a gateway is asked for partitions the others'
    maps already send to it before its own assignment arrives (the rolling-restart
    soak failure of session 24): that is UNAVAILABLE, which readers retry. Once the
    map names the topic, a partition it does not hold is a bad ticket again."""
    owners = OwnerDirectory()
    owners.expect(["t"])
    catalog = LaneCatalog(LaneLayout(tmp_path), COLS, LiveTail(), ingesting=_Member(owners))
    assert owners.awaiting("t") and not owners.awaiting("other")
    with pytest.raises(fl.FlightUnavailableError, match="assignment has not arrived"):
        _plan(catalog, "t", 2)
    with pytest.raises(TicketError, match="has no partition 2"):
        _plan(catalog, "other", 2)  # a topic no group source subscribes to

    owners.publish(1, {"t": {0: "grpc://a:1", 1: "grpc://b:2"}})
    assert not owners.awaiting("t")
    _plan(catalog, "t", 1)
    with pytest.raises(TicketError, match="has no partition 2"):
        _plan(catalog, "t", 2)


def test_a_pattern_source_awaits_only_until_its_first_map() -> None:
    owners = OwnerDirectory()
    owners.expect(None)
    assert owners.awaiting("anything")
    owners.publish(1, {"t": {0: None}})
    assert not owners.awaiting("anything") and not owners.awaiting("t")
