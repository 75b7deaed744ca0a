"""Lanes in an object store (a moto S3 server on loopback): segments created once with
conditional PUTs, generations that fence a zombie's objects, the commit after the PUT,
and two gateways with their own caches serving the whole topic from the bucket.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import (
    bucket_offsets,
    committed_offsets,
    produce_json,
    read_whole,
    wait_until,
    write_segment,
)
from tests.moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer
from thalweg.config.models import ObjectStoreConfig
from thalweg.errors import OwnershipLostError, SegmentConflictError
from thalweg.lane.layout import Lane, LaneLayout, segment_name
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.lane.read.live import LiveTail
from thalweg.lane.remote.mirror import LaneMirror, LaneObject, object_name, resolve
from thalweg.lane.remote.objectstore import ObjectStore
from thalweg.lane.upkeep.retention import raise_floor
from thalweg.records.columns import MetadataColumns

pytestmark = pytest.mark.integration

PARTITIONS = 4


def bucket(moto: MotoServer) -> str:
    name = f"lanes-{uuid.uuid4().hex[:8]}"
    moto.client().create_bucket(Bucket=name)  # type: ignore[attr-defined]
    return name


def store_cfg(moto: MotoServer, url: str, cache: Path) -> dict[str, Any]:
    return {
        "endpoint_url": moto.endpoint,
        "region": REGION,
        "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET_KEY,
        "cache_dir": str(cache),
        "sync_interval_s": 0.3,
    }


def open_store(moto: MotoServer, url: str) -> ObjectStore:
    return ObjectStore(ObjectStoreConfig(**store_cfg(moto, url, Path("unused")), url=url))


def test_segments_are_created_once(moto: MotoServer, tmp_path: Path) -> None:
    store = open_store(moto, f"s3://{bucket(moto)}/lane")
    one, two = tmp_path / "one", tmp_path / "two"
    one.write_bytes(b"first bytes")
    two.write_bytes(b"other bytes")
    store.put_new("raw/x.parquet", one)
    store.put_new("raw/x.parquet", one)  # a retried PUT that had landed: the same bytes
    with pytest.raises(SegmentConflictError, match="other bytes"):
        store.put_new("raw/x.parquet", two)
    assert store.listing("raw/") == {"raw/x.parquet": len(b"first bytes")}
    got = tmp_path / "got"
    assert store.get("raw/x.parquet", got) and got.read_bytes() == b"first bytes"
    assert not store.get("raw/x.parquet", got)  # never over an existing file


def test_the_newest_generation_is_the_lane() -> None:
    zombie = LaneObject(1000, 1499, 5, "a")
    owner = LaneObject(1000, 1699, 6, "b")
    late = LaneObject(1200, 1799, 5, "c")  # a zombie's PUT landing after the owner's
    after = LaneObject(1700, 1899, 6, "d")
    assert resolve([zombie, owner, late, after]) == [owner, after]
    assert resolve([zombie]) == [zombie]
    assert object_name("00000000000000001000-00000000000000001499.parquet", 7).endswith(
        ".g0000000007.parquet"
    )


def test_restore_makes_the_local_lane_the_buckets(moto: MotoServer, tmp_path: Path) -> None:
    store = open_store(moto, f"s3://{bucket(moto)}/lane")
    layout = LaneLayout(tmp_path / "cache")
    mirror = LaneMirror(layout, store)
    d = layout.partition_dir(Lane.RAW, "t", 0)
    d.mkdir(parents=True)
    table = pa.table({"x": [1]})
    for name in ("00000000000000000000-00000000000000000009.parquet",
                 "00000000000000000010-00000000000000000019.parquet"):  # fmt: skip
        pq.write_table(table, d / name)
    # The first was PUT by generation 1; the second was written but never PUT (a crash).
    mirror.publish("t", 0, "00000000000000000000-00000000000000000009.parquet", 1, lambda: None)
    (d / "00000000000000000000-00000000000000000009.parquet").unlink()  # a new, empty cache
    report = mirror.restore("t", 0)
    assert (report.fetched, report.removed) == (1, 1)
    assert sorted(p.name for p in d.iterdir()) == [
        "00000000000000000000-00000000000000000009.parquet"
    ]


def test_two_gateways_one_bucket(
    moto: MotoServer,
    broker: Any,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    topic = topic_factory(PARTITIONS, prefix="s3lane")
    url = f"s3://{bucket(moto)}/lanes"
    group = f"s3-{uuid.uuid4().hex[:8]}"

    def start(name: str) -> RunningGateway:
        cache = tmp_path / f"cache-{name}"
        return gateway_factory(
            [topic],
            data_dir=cache,
            gateway={"data_dir": url, "object_store": store_cfg(moto, url, cache)},
            group_id=group,
        )

    a, b = start("a"), start("b")
    urls = {a.gateway.flight_url, b.gateway.flight_url}
    wait_until(
        lambda: all(set(g.gateway.owners.owners().get(topic, {}).values()) == urls for g in (a, b)),
        60,
        "a two-member map",
    )
    n = produce_json(
        broker.bootstrap, topic, ({"n": i} for i in range(4000)), partition=lambda i: i % PARTITIONS
    )
    per = dict.fromkeys(range(PARTITIONS), n // PARTITIONS)
    wait_until(
        lambda: committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS)) == per,
        60,
        "every record committed",
    )
    store = open_store(moto, url)
    seen = bucket_offsets(store, topic, PARTITIONS, tmp_path / "check-1")[0]
    want = {(p, o) for p in range(PARTITIONS) for o in range(per[p])}
    assert set(seen) == want and max(seen.values()) == 1  # committed ⇒ in the bucket, once

    # Any replica serves the whole topic's history from the bucket (its cache).
    for g in (a, b):
        assert set(read_whole(g.gateway.flight_url, topic, len(want))) == want

    # b leaves; a restores b's partitions from the bucket and goes on from their commits.
    b.stop()
    wait_until(
        lambda: set(a.gateway.owners.owners().get(topic, {}).values()) == {a.gateway.flight_url},
        60,
        "a owns every partition",
    )
    more = produce_json(
        broker.bootstrap,
        topic,
        ({"n": i} for i in range(n, n + 400)),
        partition=lambda i: i % PARTITIONS,
    )
    total = n + more
    per = dict.fromkeys(range(PARTITIONS), total // PARTITIONS)
    wait_until(
        lambda: committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS)) == per,
        60,
        "the rest committed",
    )
    time.sleep(0.5)
    want = {(p, o) for p in range(PARTITIONS) for o in range(per[p])}
    got = read_whole(a.gateway.flight_url, topic, len(want))
    assert len(got) == len(want) and set(got) == want
    seen = bucket_offsets(store, topic, PARTITIONS, tmp_path / "check-2")[0]
    assert set(seen) == want and max(seen.values()) == 1
    names = [k for k in store.listing("raw/") if k.endswith(".parquet")]
    assert names and all(".g" in k for k in names), names[:3]
    assert json.loads(json.dumps(a.gateway.owners.snapshot()))["shared_lane"] is True


def test_a_replica_that_never_read_a_topic_answers_its_first_read_whole(
    moto: MotoServer,
    broker: Any,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    """Read-through: the first read of a topic on a replica fetches the topic from the
    bucket before it is planned — whole at once, not empty (or partial) until a
    background sync pass came round (which here would be an hour away)."""
    topic = topic_factory(PARTITIONS, prefix="s3cold")
    url = f"s3://{bucket(moto)}/lanes"
    group = f"s3cold-{uuid.uuid4().hex[:8]}"
    owner_cache = tmp_path / "cache-owner"
    gateway_factory(
        [topic],
        data_dir=owner_cache,
        gateway={"data_dir": url, "object_store": store_cfg(moto, url, owner_cache)},
        group_id=group,
    )
    n = produce_json(
        broker.bootstrap, topic, ({"n": i} for i in range(2000)), partition=lambda i: i % PARTITIONS
    )
    per = dict.fromkeys(range(PARTITIONS), n // PARTITIONS)
    wait_until(
        lambda: committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS)) == per,
        60,
        "every record committed",
    )
    cache = tmp_path / "cache-replica"
    replica = gateway_factory(
        [topic],
        data_dir=cache,
        gateway={
            "data_dir": url,
            "role": "recovery",
            "object_store": {**store_cfg(moto, url, cache), "sync_interval_s": 3600},
        },
        group_id=f"reader-{group}",
    )
    with thalweg_client.connect(replica.gateway.flight_url) as client:
        first = client.read(topic)
    assert first.num_rows == n
    got = {
        (p, o)
        for p, o in zip(
            *(first.column(c).to_pylist() for c in ("_twg_source_partition", "_twg_source_offset")),
            strict=True,
        )
    }
    assert got == {(p, o) for p in range(PARTITIONS) for o in range(per[p])}


def test_a_publish_the_fence_stopped_leaves_nothing_behind(
    moto: MotoServer, tmp_path: Path
) -> None:
    """The fence refuses the raw PUT after the decoded twin's landed: the segment is not
    in the store (``landed``), its local files go, and the records written again (other
    bytes, same name) replace the orphaned twin."""
    store = open_store(moto, f"s3://{bucket(moto)}/lane")
    layout = LaneLayout(tmp_path / "cache")
    mirror = LaneMirror(layout, store)
    name = "00000000000000000000-00000000000000000009.parquet"
    for lane in (Lane.RAW, Lane.DECODED):
        layout.partition_dir(lane, "t", 0).mkdir(parents=True)
        pq.write_table(pa.table({"x": [1]}), layout.partition_dir(lane, "t", 0) / name)
    calls = []

    def fence() -> None:
        calls.append(1)
        if len(calls) == 2:  # before the raw PUT
            raise OwnershipLostError("in doubt")

    with pytest.raises(OwnershipLostError):
        mirror.publish("t", 0, name, 3, fence)
    assert not mirror.landed("t", 0, name, 3)
    mirror.discard_local("t", 0, name)
    for lane in (Lane.RAW, Lane.DECODED):
        assert not list(layout.partition_dir(lane, "t", 0).iterdir())

    for lane in (Lane.RAW, Lane.DECODED):
        pq.write_table(pa.table({"x": [1, 2]}), layout.partition_dir(lane, "t", 0) / name)
    mirror.publish("t", 0, name, 3, lambda: None)
    assert mirror.landed("t", 0, name, 3)
    got = tmp_path / "twin.parquet"
    store.get(f"decoded/topic=t/partition=0/{object_name(name, 3)}", got)
    assert pq.read_table(got).num_rows == 2  # the orphan twin was replaced


def test_retention_and_compaction_of_a_bucket_lane(
    moto: MotoServer,
    broker: Any,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    """The owner merges small segments and PUTs the merged objects before the parts
    leave the bucket; retention publishes the floor before deleting what lies below it;
    a replica that owns nothing (recovery only) follows both from the bucket."""
    topic = topic_factory(1, prefix="s3keep")
    url = f"s3://{bucket(moto)}/lanes"

    def lane(name: str) -> dict[str, Any]:
        cache = tmp_path / f"cache-{name}"
        return {"data_dir": url, "object_store": store_cfg(moto, url, cache)}

    owner = gateway_factory(
        [topic],
        data_dir=tmp_path / "cache-owner",
        gateway=lane("owner"),
        raw_lane={"roll_age_s": 0.05},
        # Merged files of two or three segments, and a bound of a few of them: the floor
        # lands inside the lane whatever the merges grouped.
        compaction={"enabled": True, "min_files": 2, "min_age_s": 0, "grace_s": 0.5,
                    "interval_s": 0.3, "target_bytes": 45_000},
        retention={"max_bytes": 100_000, "grace_s": 0.5, "interval_s": 0.3},
    )  # fmt: skip
    for batch in range(12):  # small segments, each a fetch of its own
        produce_json(broker.bootstrap, topic, ({"n": batch * 500 + i, "pad": "x" * 80}
                                               for i in range(500)))  # fmt: skip
        owner.wait_durable(topic, {0: (batch + 1) * 500})
    store = open_store(moto, url)
    mirror = LaneMirror(LaneLayout(tmp_path / "check"), store)

    def settled() -> bool:
        raw = mirror.objects(Lane.RAW, topic, 0)
        floor = owner.gateway.layout.floor(topic, 0)
        return (
            floor > 0
            and len(raw) == len(resolve(raw))  # no part left beside its merged object
            and all(o.first >= floor or o.last >= floor for o in raw)  # none wholly below
            and any(".g" in o.rel for o in raw)
        )

    def still() -> bool:
        """Settled, and the floor no longer moving (retention and compaction done)."""
        before = owner.gateway.layout.floor(topic, 0)
        time.sleep(1.0)
        return settled() and owner.gateway.layout.floor(topic, 0) == before

    wait_until(still, 60, lambda: f"the bucket compacted and trimmed: {store.listing('raw/')}")
    floor = owner.gateway.layout.floor(topic, 0)
    objects = resolve(mirror.objects(Lane.RAW, topic, 0))
    assert len(objects) < 12
    assert objects[-1].last == 5999
    assert objects[0].first <= floor
    assert store.read(f"retention/topic={topic}/0.json") is not None

    # A replica that owns nothing serves the same lane from the bucket: from the floor.
    reader = gateway_factory(
        [topic], data_dir=tmp_path / "cache-reader", gateway={**lane("reader"), "role": "recovery"}
    )
    got = read_whole(reader.gateway.flight_url, topic, 6000 - floor)
    assert [o for _, o in got] == list(range(floor, 6000))
    with (
        thalweg_client.connect(reader.gateway.flight_url) as client,
        pytest.raises(pa.ArrowInvalid, match=f"earliest available is {floor}"),
    ):
        client.read(topic, start={"offset": 0})
    # The offset just below the floor, past the grace: refused by the owner and by the
    # replica alike, whatever file below the floor a cache still holds.
    for gw in (owner, reader):
        with (
            thalweg_client.connect(gw.gateway.flight_url) as client,
            pytest.raises(pa.ArrowInvalid, match=f"offset {floor - 1} was removed by retention"),
        ):
            client.read(topic, start={"offset": floor - 1}, lane="raw")


def test_orphaned_twin_objects_are_swept_once_seen_long_enough(
    moto: MotoServer, tmp_path: Path
) -> None:
    """Twins PUT before a raw PUT that never came (a crash between them) are nobody's:
    the owner's sweep removes them once seen orphaned for ``age_s``; a twin whose raw
    object lands meanwhile, and every twin of a landed segment, stays."""
    store = open_store(moto, f"s3://{bucket(moto)}/lane")
    layout = LaneLayout(tmp_path / "cache")
    mirror = LaneMirror(layout, store)
    landed, lost, late = (f"{a:020d}-{b:020d}.parquet" for a, b in ((0, 9), (10, 19), (20, 29)))
    twin = tmp_path / "twin.parquet"
    pq.write_table(pa.table({"x": [1]}), twin)
    for lane in (Lane.RAW, Lane.DECODED):
        layout.partition_dir(lane, "t", 0).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"x": [1]}), layout.partition_dir(lane, "t", 0) / landed)
    mirror.publish("t", 0, landed, 1, lambda: None)
    for lane in ("decoded", "dlq"):
        store.put_new(f"{lane}/topic=t/partition=0/{object_name(lost, 1)}", twin)
    store.put_new(f"decoded/topic=t/partition=0/{object_name(late, 1)}", twin)

    assert mirror.delete_orphans("t", 0, age_s=3600) == 0  # first seen: not yet
    store.put_new(f"raw/topic=t/partition=0/{object_name(late, 1)}", twin)  # its raw lands
    assert mirror.delete_orphans("t", 0, age_s=0) == 2  # the lost segment's two twins
    left = sorted(store.listing(""))
    assert left == sorted(
        [
            f"{lane}/topic=t/partition=0/{object_name(name, 1)}"
            for lane, name in (
                ("raw", landed),
                ("decoded", landed),
                ("raw", late),
                ("decoded", late),
            )
        ]
    )
    assert mirror._orphans == {}


def test_a_read_below_the_floor_is_refused_on_every_replica_once_its_grace_passed(
    moto: MotoServer, tmp_path: Path
) -> None:
    """A file can straddle the floor (a merge, a restore after a kill -9): never swept,
    it still holds positions below it. Past the grace of the rise that put them there,
    those are refused on the owner and on a replica that learned the floor later — the
    replica keeps the time the floor rose in the bucket, not when it synced it. Within
    the grace (an endpoint planned before the rise) both still answer."""
    store = open_store(moto, f"s3://{bucket(moto)}/lane")
    owner = LaneLayout(tmp_path / "owner")
    write_segment(owner.root, "t", 0, range(10), 0)
    write_segment(owner.root, "t", 1, range(10), 0)
    raise_floor(owner, "t", 0, 5, time.time() - 120)  # long past the 60 s grace
    raise_floor(owner, "t", 1, 5, time.time())  # just now
    mirror = LaneMirror(owner, store)
    for p in (0, 1):
        mirror.publish("t", p, segment_name(0, 9), 1, lambda: None)
        mirror.publish_floor("t", p)
    replica = LaneLayout(tmp_path / "replica")
    later = LaneMirror(replica, store)
    for p in (0, 1):
        later.restore("t", p)
    assert (replica.partition_dir(Lane.RAW, "t", 0) / segment_name(0, 9)).exists()
    rose = owner.floor_rose_at("t", 0, 4)
    assert rose is not None and replica.floor_rose_at("t", 0, 4) == pytest.approx(rose)
    for layout in (owner, replica):
        catalog = LaneCatalog(layout, MetadataColumns(), LiveTail(), retention_grace_s=60)
        assert not catalog.still_held("t", 0, 4)
        assert catalog.still_held("t", 0, 5)
        assert catalog.still_held("t", 1, 4)  # within the grace of its rise
        strict = LaneCatalog(layout, MetadataColumns(), LiveTail(), retention_grace_s=0)
        assert not strict.still_held("t", 1, 4)
