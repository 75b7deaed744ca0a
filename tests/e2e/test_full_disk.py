"""A disk that fills up for real (a small tmpfs: the kernel answers ENOSPC) under the data
directory — or under a bucket lane's local cache — mid-run, and space that comes back.

While the disk is full nothing is committed that is not durable: the broker's committed
offset (``twg stream``) and the batch manifest's ``committed`` (``twg batch``) stay at the
rows the lane (or the bucket) holds, the gateway says it is not ready and why, and the
run waits rather than dropping rows. Once space returns every record lands, once, and no
temp file of a refused write is left.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from tests.conftest import RunningGateway, TansuBroker
from tests.e2e.upkeep import lane_files, nested, ranges
from tests.helpers import (
    SmallDisk,
    assert_verified,
    bucket_offsets,
    committed_offsets,
    produce_json,
    wait_until,
)
from tests.integration.test_batch import lane, manifest, rows
from tests.integration.test_object_store import bucket, open_store, store_cfg
from tests.moto_server import MotoServer
from thalweg.lane.layout import segment_name

pytestmark = pytest.mark.integration

P = "_twg_"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], SmallDisk]]:
    disks: list[SmallDisk] = []

    def mount(kib: int) -> SmallDisk:
        disk = SmallDisk(tmp_path / f"disk-{len(disks)}", kib)
        disks.append(disk)
        return disk

    yield mount
    for disk in disks:
        disk.close()


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".tmp" in p.name]


def twins_missing(root: Path, topic: str) -> list[str]:
    """The raw segments under ``root`` whose decoded twin is not on disk."""
    missing = []
    for raw_dir in sorted((root / "raw" / f"topic={topic}").glob("partition=*")):
        decoded_dir = root / "decoded" / f"topic={topic}" / raw_dir.name
        for segment in sorted(raw_dir.glob("*.parquet")):
            if not (decoded_dir / segment.name).exists():
                missing.append(f"{raw_dir.name}/{segment.name}")
    return missing


def lane_rows(root: Path, topic: str) -> int:
    files = (root / "raw" / f"topic={topic}").rglob("*.parquet")
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def admin(gw: RunningGateway, path: str) -> tuple[int, str]:
    """The status and body of one of the gateway's admin endpoints (an error's too)."""
    try:
        with urllib.request.urlopen(f"{gw.admin_url}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_full(gw: RunningGateway) -> None:
    """Until ``/health`` names the full disk and ``/ready`` says not ready (nothing can be
    made durable). Both at once, not one after the other: a refused *decoded* segment is
    named first and leaves the gateway ready by design (the raw lane is primary and
    rebuilds it), so readiness drops only when a raw write is refused a moment later."""

    def full() -> bool:
        status, _ = admin(gw, "/ready")
        return status == 503 and "No space left on device" in admin(gw, "/health")[1]

    wait_until(full, 60, "/ready 503 with /health naming a lane write refused for space")


def produce_digests(
    broker: TansuBroker, producer: Producer, topic: str, total: int, partitions: int = 1
) -> None:
    """``total`` records ``{"id": i, "pad": <a hex digest>}`` (the digests do not
    compress: the lanes take about 130 bytes a record), round robin over partitions."""
    docs = ({"id": i, "pad": hashlib.sha256(b"%d" % i).hexdigest()} for i in range(total))
    produce_json(
        broker.bootstrap, topic, docs, partition=lambda i: i % partitions, producer=producer
    )


def test_twg_batch_waits_on_a_full_disk_commits_only_what_is_durable_and_finishes(
    tmp_path: Path, small_disk: Callable[[int], SmallDisk]
) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    expected = [rows(60_000, i * 100_000) for i in range(3)]
    for i, t in enumerate(expected):
        pacsv.write_csv(t, inputs / f"part-{i}.csv")
    disk = small_disk(400)  # the three files' lanes take about 750 KiB
    data = disk.path / "data"
    config = tmp_path / "thalweg.toml"
    config.write_text(
        f"""
[gateway]
data_dir = "{data}"
gc_tuning = false

[raw_lane]
roll_age_s = 0.2
roll_rows = 20000

[[sources]]
kind = "files"
name = "files"
topics = ["drops"]
max_poll_records = 2000
"""
    )
    err = tmp_path / "stderr.log"
    argv = [sys.executable, "-m", "thalweg.cli.main", "--output", "json", "batch"]
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(
            [*argv, "-c", str(config), str(inputs)], stdout=subprocess.PIPE, stderr=stderr
        )
        try:
            wait_until(
                lambda: err.read_bytes().count(b"No space left on device") >= 3,
                60,
                "segment writes refused for want of space, and retried",
                check=lambda: proc.poll() is None or pytest.fail(f"exited {proc.returncode}"),
            )
            assert proc.poll() is None  # waiting, not failed and not finished
            files = manifest(data, "drops")["files"]
            committed = sum(e["committed"] for e in files)
            durable = lane_rows(data, "drops")
            assert 0 < durable < 180_000  # filled mid-run
            assert committed <= durable  # nothing committed ahead of the lane
            disk.grow(64 * 1024)  # an operator frees space
            out, _ = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 0, err.read_text()[-3000:]
    s = json.loads(out.decode().strip().splitlines()[-1])
    assert s["ok"] and s["rows"] == 180_000 and s["files_done"] == 3
    raw, decoded = lane(data, "raw", "drops"), lane(data, "decoded", "drops")
    keys = list(
        zip(raw[f"{P}source_partition"].to_pylist(), raw[f"{P}position"].to_pylist(), strict=True)
    )
    assert len(keys) == len(set(keys)) == 180_000  # every row, once
    for e, t in zip(sorted(files, key=lambda e: e["partition"]), expected, strict=True):
        part = decoded.filter(pa.compute.equal(decoded[f"{P}source_partition"], e["partition"]))
        assert part.select(["id", "name", "amount"]).equals(t)
    assert temp_files(data) == []  # the refused writes left nothing behind


def test_twg_stream_on_a_full_disk_commits_nothing_ahead_of_the_lane_and_catches_up(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    small_disk: Callable[[int], SmallDisk],
) -> None:
    topic = topic_factory(2)
    total = 40_000
    produce_digests(broker, producer, topic, total, partitions=2)  # lanes of about 5 MiB
    disk = small_disk(1024)
    gw = gateway_factory(
        [topic], data_dir=disk.path / "lane", raw_lane={"roll_rows": 2_000}, max_poll_records=1_000
    )
    gateway = gw.gateway
    source = gateway.cfg.sources[0]
    end = gateway.catalog.durable_end

    wait_full(gw)
    # The commit first: a write that lands in between moves the durable end, never back.
    committed = committed_offsets(source.bootstrap_servers, source.group_id, topic, [0, 1])
    durable = {p: end(topic, p) for p in (0, 1)}
    assert 0 < sum(durable.values()) < total  # filled mid-ingest
    for p in (0, 1):
        assert committed.get(p, -1) <= durable[p]  # the commit invariant holds
    disk.grow(64 * 1024)
    gw.wait_durable(topic, {0: total // 2, 1: total // 2}, timeout=120)
    wait_until(lambda: admin(gw, "/ready")[0] == 200, 30, "ready again once writes succeed")
    for p in (0, 1):
        assert gw.committed(topic, p, total // 2, timeout=30) == total // 2
    table = pa.concat_tables(
        pq.read_table(f, columns=[f"{P}source_partition", f"{P}source_offset"])
        for f in sorted((gw.data_dir / "raw").rglob("*.parquet"))
    )
    keys = list(zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True))
    assert len(keys) == len(set(keys)) == total  # every record, once
    assert temp_files(gw.data_dir) == []  # the refused writes left nothing behind


def test_compaction_on_a_full_disk_leaves_no_half_merge_and_finishes_once_space_returns(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    small_disk: Callable[[int], SmallDisk],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Merges need room for the merged file while its parts remain: on a disk that the
    ingest has nearly filled they fail. A failed merge leaves its parts as they were
    and none of its twins (the space is the ingest's); once space returns the merges
    finish and every record is on disk once, in the raw and decoded lanes."""
    caplog.set_level(logging.WARNING, logger="thalweg.ops.periodic")
    topic = topic_factory(1)
    total = 20_000
    produce_digests(broker, producer, topic, total)
    disk = small_disk(3 * 1024)  # the lanes take about 2.5 MiB; a merge of them as much
    gw = gateway_factory(
        [topic],
        data_dir=disk.path / "lane",
        raw_lane={"roll_rows": 500},
        max_poll_records=500,
        compaction={"enabled": True, "min_age_s": 0, "min_files": 4, "interval_s": 0.3,
                    "grace_s": 0.5},
    )  # fmt: skip
    raw_dir = gw.data_dir / "raw" / f"topic={topic}" / "partition=0"
    decoded_dir = gw.data_dir / "decoded" / f"topic={topic}" / "partition=0"

    def refused() -> bool:
        return any(
            "compaction run failed" in r.getMessage()
            and "No space left on device" in (r.exc_text or str(r.exc_info))
            for r in caplog.records
        )

    def lone_twins() -> list[str]:
        """Decoded files of a merge whose raw file is not there."""
        raw = set(ranges(raw_dir))
        return [segment_name(*s) for s in ranges(decoded_dir) if s not in raw]

    wait_until(refused, 90, "a merge refused for want of space")
    wait_until(lambda: lone_twins() == [], 10, lambda: f"no half merge: {lone_twins()}")
    disk.grow(64 * 1024)
    gw.wait_durable(topic, {0: total}, timeout=120)

    def settled() -> bool:
        spans = ranges(raw_dir)
        return len(spans) <= 4 and not nested(spans)

    wait_until(settled, 60, lambda: f"merges to finish: {ranges(raw_dir)}")
    raw = lane_files(gw.data_dir, "raw", topic, [f"{P}source_offset"])
    assert sorted(raw.column(0).to_pylist()) == list(range(total))  # every file on disk
    decoded = lane_files(gw.data_dir, "decoded", topic, ["id"])
    assert sorted(decoded.column(0).to_pylist()) == list(range(total))
    assert lone_twins() == []
    assert temp_files(gw.data_dir) == []


def test_retention_makes_room_on_a_full_disk_and_the_ingest_goes_on(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    small_disk: Callable[[int], SmallDisk],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A disk a fifth the size of the topic's lanes, retention by age, and no operator:
    writes refused for want of space wait while retention removes old segments, and the
    ingest reaches the end of the topic. A backlog fetched while writes waited is
    written as segments of the roll size (never one segment of all of it, which
    retention, never removing a partition's newest segment, could not make room below).
    What the lanes keep at the end is one unbroken run of positions up to the end, in
    the raw and decoded lanes alike, each once."""
    caplog.set_level(logging.WARNING)
    topic = topic_factory(1)
    total = 40_000
    produce_digests(broker, producer, topic, total)
    disk = small_disk(1024)  # the lanes of the whole topic take about 5 MiB
    gw = gateway_factory(
        [topic],
        data_dir=disk.path / "lane",
        raw_lane={"roll_rows": 2_000},
        max_poll_records=1_000,
        retention={"max_age_s": 1, "grace_s": 0, "interval_s": 0.3},
    )
    gw.wait_durable(topic, {0: total}, timeout=180)
    assert gw.committed(topic, 0, total, timeout=30) == total
    assert any("No space left on device" in r.getMessage() for r in caplog.records)
    raw_dir = gw.data_dir / "raw" / f"topic={topic}" / "partition=0"
    spans = ranges(raw_dir)
    assert spans[0][0] > 0, "retention removed the oldest segments"
    assert spans[-1][1] == total - 1
    for before, after in pairwise(spans):
        assert after[0] == before[1] + 1, f"a hole or an overlap: {spans}"
    assert max(end - start + 1 for start, end in spans) <= 2_000  # the roll size
    # Retention may remove more meanwhile: read the files once, then compare.
    raw = lane_files(gw.data_dir, "raw", topic, [f"{P}source_offset"])
    offsets = raw.column(0).to_pylist()
    assert len(offsets) == len(set(offsets))
    assert temp_files(gw.data_dir) == []


def test_a_full_object_store_cache_commits_nothing_ahead_of_the_bucket_and_catches_up(
    broker: TansuBroker,
    moto: MotoServer,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
    small_disk: Callable[[int], SmallDisk],
    tmp_path: Path,
) -> None:
    """A bucket lane writes each segment in its local cache before the PUT: a cache disk
    that fills stops the writes there, and the commit stays at what the bucket holds."""
    topic = topic_factory(2)
    total = 40_000
    produce_digests(broker, producer, topic, total, partitions=2)  # lanes of about 5 MiB
    disk = small_disk(1024)
    cache = disk.path / "cache"
    url = f"s3://{bucket(moto)}/lanes"
    gw = gateway_factory(
        [topic],
        data_dir=cache,
        gateway={"data_dir": url, "object_store": store_cfg(moto, url, cache)},
        raw_lane={"roll_rows": 2_000},
        max_poll_records=1_000,
    )
    source = gw.gateway.cfg.sources[0]
    store = open_store(moto, url)

    wait_full(gw)
    # The commit first: a PUT that lands in between moves the bucket's end, never back.
    committed = committed_offsets(source.bootstrap_servers, source.group_id, topic, [0, 1])
    held, _ = bucket_offsets(store, topic, 2, tmp_path / "check-full")
    for p in (0, 1):
        in_bucket = {o for q, o in held if q == p}
        upto = committed.get(p, 0)
        assert set(range(upto)) <= in_bucket, f"partition {p} committed past the bucket"
    assert 0 < len(held) < total  # filled mid-ingest
    disk.grow(64 * 1024)
    for p in (0, 1):
        assert gw.committed(topic, p, total // 2, timeout=120) == total // 2
    wait_until(lambda: admin(gw, "/ready")[0] == 200, 30, "ready again once writes succeed")
    seen, overlapping = bucket_offsets(store, topic, 2, tmp_path / "check-after")
    assert overlapping == []
    assert set(seen) == {(p, o) for p in (0, 1) for o in range(total // 2)}
    assert max(seen.values()) == 1  # every record in the bucket, once
    assert temp_files(cache) == []  # the refused writes left nothing behind
    # A decoded twin whose write hit the full disk is rebuilt with backoff while the
    # gateway runs: caught up means the decoded lane too, which verify checks.
    wait_until(lambda: twins_missing(cache, topic) == [], 120, "every decoded twin rebuilt")
    gw.stop()
    assert_verified(gw.gateway.cfg)
