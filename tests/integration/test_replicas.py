"""Two gateways on one consumer group, each with its own data_dir.

Every read reaches the partition's owner: ``get_flight_info`` at either replica names
the owner of each partition in its endpoint, a ``do_get`` of a partition this replica
does not own is refused with where to go (never answered partially), the client follows
the endpoints, and a follow stream through one replica continues on the new owner when
the other leaves. After the move, the partitions' history is split between two
data_dirs, and a read that crosses the split is refused with the offsets it lacks.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import committed_offsets, partition_offsets, produce_json, wait_until
from thalweg.embedded import TansuBroker

pytestmark = pytest.mark.integration

PARTITIONS = 4


def owners_of(rg: RunningGateway, topic: str) -> dict[str, Any]:
    snap = rg.gateway.owners.snapshot()
    owners = snap["owners"]
    assert isinstance(owners, dict)
    found: dict[str, Any] = owners.get(topic, {})
    return found


def both_members(gws: list[RunningGateway], topic: str) -> bool:
    """Both gateways hold the same two-member map of every partition."""
    maps = [owners_of(g, topic) for g in gws]
    urls = {g.gateway.flight_url for g in gws}
    return all(len(m) == PARTITIONS and set(m.values()) == urls for m in maps) and (
        maps[0] == maps[1]
    )


class Follower:
    """A follow stream through one client, collecting (partition, offset) pairs."""

    def __init__(self, client: thalweg_client.Client, topic: str) -> None:
        self.seen: list[tuple[int, int]] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._reader = client.stream(topic, end="follow")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for batch in self._reader:
                got = partition_offsets(pa.Table.from_batches([batch]))
                with self._lock:
                    self.seen.extend(got)
        except BaseException as exc:
            self.error = exc

    def count(self) -> int:
        if self.error is not None:
            raise self.error
        with self._lock:
            return len(self.seen)


def probe_until_joined(
    rg: RunningGateway, topic: str, joined: Callable[[], bool]
) -> list[BaseException]:
    """Ask ``rg`` for partition 0 over and over while it joins the group, and return how
    it refused. Before its assignment arrives a member cannot tell a partition of the
    topic from none: it must say retry (UNAVAILABLE), never a bad ticket — the rolling-
    restart soak failure of session 24 was a reader told INVALID_ARGUMENT there."""
    body = json.dumps({"topic": topic, "partitions": [0], "end": "now"}).encode()
    refusals: list[BaseException] = []
    client = fl.FlightClient(rg.gateway.flight_url)
    deadline = time.monotonic() + 60
    try:
        while not joined():
            assert time.monotonic() < deadline, "both members in the owner map"
            try:
                client.do_get(fl.Ticket(body)).read_all()
            except (fl.FlightError, pa.ArrowException) as exc:
                refusals.append(exc)
            time.sleep(0.05)
    finally:
        client.close()
    return refusals


def test_any_replica_reaches_every_partition_and_follows_a_move(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(PARTITIONS, prefix="replicas")
    group = f"replicas-{uuid.uuid4().hex[:8]}"
    a = gateway_factory([topic], group_id=group)
    b = gateway_factory([topic], group_id=group)
    refusals = probe_until_joined(b, topic, lambda: both_members([a, b], topic))
    assert all(isinstance(e, fl.FlightUnavailableError) for e in refusals), refusals
    first = produce_json(
        broker.bootstrap,
        topic,
        ({"n": i} for i in range(4000)),
        partition=lambda i: i % PARTITIONS,
    )
    per = dict.fromkeys(range(PARTITIONS), first // PARTITIONS)
    wait_until(
        lambda: committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS)) == per,
        60,
        "every record committed",
    )

    owners = owners_of(a, topic)
    mine = {int(p) for p, loc in owners.items() if loc == a.gateway.flight_url}
    theirs = {int(p) for p, loc in owners.items() if loc == b.gateway.flight_url}
    assert mine and theirs and mine | theirs == set(range(PARTITIONS))

    # get_flight_info at a: each endpoint names its partition's owner.
    want = {(p, o) for p in range(PARTITIONS) for o in range(per[p])}
    with thalweg_client.connect(a.gateway.flight_url) as client:
        info = client.endpoints(topic)
        for endpoint in info.endpoints:
            meta = json.loads(endpoint.app_metadata)
            expect = a.gateway.flight_url if meta["partition"] in mine else b.gateway.flight_url
            assert [loc.uri.decode() for loc in endpoint.locations] == [expect]
            assert meta["location"] == expect

        # The client follows the endpoints: the whole topic through one replica.
        got = partition_offsets(client.read(topic))
        assert len(got) == len(set(got)) and set(got) == want

    # A plain do_get of the whole topic at a is refused, naming b — never partial.
    raw = fl.FlightClient(a.gateway.flight_url)
    body = json.dumps({"topic": topic, "start": "earliest", "end": "now"}).encode()
    with pytest.raises(fl.FlightUnavailableError) as refused:
        raw.do_get(fl.Ticket(body)).read_all()
    assert b.gateway.flight_url in str(refused.value)
    detail = json.loads(refused.value.extra_info)["relocate"]
    assert detail["owner"] == b.gateway.flight_url
    assert detail["positions"] == {}  # nothing was sent: the ticket stands as asked
    raw.close()

    # Follow through a, then b leaves: its partitions move to a, and the stream goes on.
    with thalweg_client.connect(a.gateway.flight_url) as client:
        follower = Follower(client, topic)
        wait_until(lambda: follower.count() >= first, 60, "the follow stream caught up")
        second = produce_json(
            broker.bootstrap,
            topic,
            ({"n": i} for i in range(first, first + 400)),
            partition=lambda i: i % PARTITIONS,
        )
        wait_until(lambda: follower.count() >= first + second, 60, "live records followed")
        b.stop()
        wait_until(
            lambda: set(owners_of(a, topic).values()) == {a.gateway.flight_url},
            60,
            "a owns every partition",
        )
        third = produce_json(
            broker.bootstrap,
            topic,
            ({"n": i} for i in range(first + second, first + second + 400)),
            partition=lambda i: i % PARTITIONS,
        )
        total = first + second + third
        wait_until(lambda: follower.count() >= total, 60, "followed across the move")
        seen = list(follower.seen)
    assert len(seen) == total, f"{len(seen) - len(set(seen))} duplicates"
    n = total // PARTITIONS
    assert set(seen) == {(p, o) for p in range(PARTITIONS) for o in range(n)}

    # b's partitions' history is now split between two data_dirs: a refuses to answer
    # from its half alone, and says which offsets it lacks.
    with thalweg_client.connect(a.gateway.flight_url) as client:
        with pytest.raises(pa.ArrowInvalid, match="not in this gateway's data_dir"):
            client.read(topic)
        p = min(theirs)
        a.wait_durable(topic, {p: n})
        later = partition_offsets(
            client.read(topic, partitions=[p], start={"offset": per[p] + 100})
        )
        assert later == [(p, o) for o in range(per[p] + 100, n)]
