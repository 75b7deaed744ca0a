"""Compaction and retention of lanes in a bucket (a moto S3 server) under SIGKILL:
``twg stream`` killed again and again while records arrive, merges PUT their merged
objects and delete their parts', and retention publishes floors and deletes the objects
below them.

A kill can land between a merged object's PUT and its parts' deletion, between a twin's
PUT and its raw object's (an orphan the owner sweeps), between a floor's PUT and the
deletions below it, or inside a DeleteObjects' order (twins, then raw). At the end the
bucket's lane, as every reader resolves it, holds each partition's positions from its
floor to its end exactly once, with no object lying inside another, no object below
the floor and no orphaned twin; the decoded objects hold the same records once; every
offset is committed; and ``twg verify`` over the bucket finds nothing.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.e2e.upkeep import (
    PARTITIONS,
    TOTAL,
    config_text,
    kill_repeatedly,
    nested,
    produce,
    run_until_settled,
    temp_files,
)
from tests.helpers import assert_verified, bucket_offsets, committed_offsets, seeded_rng
from tests.moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer
from thalweg.config.retention import CompactionConfig
from thalweg.embedded import TansuBroker
from thalweg.lane.layout import Lane, LaneLayout
from thalweg.lane.remote.mirror import LaneMirror, resolve
from thalweg.lane.remote.objectstore import ObjectStore
from thalweg.lane.upkeep.compaction import plan_runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Merges of four 100-row segments into files of at most ~60 KB, parts deleted 2 s later;
# at most 150 KB per partition, swept 2 s after the floor rises; orphans swept once seen
# so for 2 s (``orphan_age_s`` below).
UPKEEP = """
[compaction]
enabled = true
min_files = 4
min_age_s = 0
target_bytes = 60000
grace_s = 2.0
interval_s = 0.2

[retention]
max_bytes = 150000
grace_s = 2.0
interval_s = 0.2
"""


def test_bucket_upkeep_killed_again_and_again_keeps_exactly_the_floor_to_the_end(
    broker: TansuBroker, topic_factory: Callable[..., str], moto: MotoServer, tmp_path: Path
) -> None:
    topic = topic_factory(PARTITIONS, prefix="bucket-upkeep")
    group = f"bucket-upkeep-{uuid.uuid4().hex[:8]}"
    url = moto.bucket_url()
    cache = tmp_path / "cache"
    store_keys = {
        "endpoint_url": moto.endpoint,
        "region": REGION,
        "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET_KEY,
        "cache_dir": str(cache),
        "sync_interval_s": 0.3,
        # A kill between a twin's PUT and its raw one leaves an orphan; at the default
        # (120 s) the settle wait below could not outlast it.
        "orphan_age_s": 2.0,
    }
    object_store = "\n".join(f"{k} = {json.dumps(v)}" for k, v in store_keys.items())
    config = tmp_path / "twg.toml"
    log = tmp_path / "gateway.log"
    text = config_text(broker.bootstrap, topic, group, Path("unused"), UPKEEP)
    text = text.replace('data_dir = "unused"', f'data_dir = "{url}"', 1)
    text = text.replace("[raw_lane]", f"[gateway.object_store]\n{object_store}\n\n[raw_lane]", 1)
    config.write_text(text)
    store: ObjectStore = moto.store(url)  # type: ignore[assignment]
    mirror = LaneMirror(LaneLayout(tmp_path / "unused-cache"), store)
    produced = produce(broker.bootstrap, topic, pad=200)
    expected = {q: len(range(q, TOTAL, PARTITIONS)) for q in range(PARTITIONS)}

    def floor(q: int) -> int:
        body = store.read(f"retention/topic={topic}/{q}.json")
        return int(json.loads(body)["floor"]) if body else 0

    def spans(lane: Lane, q: int) -> list[tuple[int, int]]:
        return sorted((o.first, o.last) for o in mirror.objects(lane, topic, q))

    def orphans(q: int) -> int:
        raw = {o.rel.rsplit("/", 1)[1] for o in mirror.objects(Lane.RAW, topic, q)}
        return sum(
            o.rel.rsplit("/", 1)[1] not in raw
            for lane in (Lane.DECODED, Lane.DLQ)
            for o in mirror.objects(lane, topic, q)
        )

    def pending(q: int) -> bool:
        """Upkeep left mid-way in the bucket: a merge's parts beside it, objects below
        a published floor, or an orphaned twin."""
        raw = spans(Lane.RAW, q)
        below = any(last < floor(q) for _, last in raw)
        return bool(nested(raw)) or below or orphans(q) > 0

    rng = seeded_rng("THALWEG_CRASH_SEED")  # printed: a failing run can be replayed
    kills = kill_repeatedly(config, log, rng, lambda: any(map(pending, range(PARTITIONS))))
    print(f"{kills.mid_way} of {kills.total} kills left upkeep pending in the bucket")
    assert kills.mid_way >= 1, "no kill found upkeep pending in the bucket"
    assert produced.wait(60), "the producer did not finish"

    def end(q: int) -> int:
        lane = resolve(mirror.objects(Lane.RAW, topic, q))
        return lane[-1].last + 1 if lane else 0

    due = CompactionConfig(enabled=True, min_files=4, min_age_s=0, target_bytes=60000)
    local = LaneLayout(cache)

    def settled() -> bool:
        """Everything ingested, merged, swept — and no merge due in the owner's cache:
        one landing during the stop would leave its parts beside it, inside their grace
        period (as tests/e2e/test_compaction_crash.py explains)."""
        quiet = not any(plan_runs(local, topic, q, due, time.time()) for q in range(PARTITIONS))
        return quiet and all(
            end(q) == expected[q] and floor(q) > 0 and not pending(q) for q in range(PARTITIONS)
        )

    run_until_settled(config, log, settled, "ingest, merges and sweeps to finish in the bucket")

    assert temp_files(cache) == []
    seen, overlapping = bucket_offsets(store, topic, PARTITIONS, tmp_path / "check")
    assert overlapping == []
    assert max(seen.values()) == 1, [k for k, n in seen.items() if n > 1][:5]
    floors = {q: floor(q) for q in range(PARTITIONS)}
    for q in range(PARTITIONS):
        held = sorted(o for p, o in seen if p == q)
        assert held == list(range(floors[q], expected[q])), f"raw partition {q}"
        # Every object, not only the resolved ones: nothing below the floor, no parts.
        assert not nested(spans(Lane.RAW, q)) and spans(Lane.RAW, q)[0][0] >= 0
        assert all(last >= floors[q] for _, last in spans(Lane.RAW, q))
    decoded: Counter[int] = Counter()
    for q in range(PARTITIONS):
        for o in resolve(mirror.objects(Lane.DECODED, topic, q)):
            dest = tmp_path / "check" / o.rel.replace("/", "_")
            store.get(o.rel, dest)
            decoded.update(pq.read_table(dest, columns=["n"]).column(0).to_pylist())
    kept = [n for n in range(TOTAL) if n // PARTITIONS >= floors[n % PARTITIONS]]
    assert sorted(decoded) == kept and max(decoded.values()) == 1  # the same records, once
    merged = [s for q in range(PARTITIONS) for s in spans(Lane.RAW, q) if s[1] - s[0] >= 100]
    assert merged, "nothing was merged"
    assert committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS)) == expected
    assert_verified(config)
