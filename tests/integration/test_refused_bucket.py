"""A sink's dead-letter lane in the bucket, like the lanes it refused from
(``lane/remote/refused_sync.py``), on moto: the feeder puts each file there before it
covers its records, a host whose cache was wiped fetches them back before it rechecks
or feeds, and ``twg verify`` away from the gateway's host accounts for them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from tests.helpers import write_segment
from tests.integration.test_object_store import bucket, open_store, store_cfg
from tests.moto_server import MotoServer
from thalweg.cli.main import cli
from thalweg.config import load_config
from thalweg.config.models import ThalwegConfig
from thalweg.lane import LaneLayout
from thalweg.lane.remote.mirror import LaneMirror, object_name
from thalweg.lane.remote.objectstore import ObjectStore
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders
from thalweg.recovery.refused import SinkDeadLetters

BAD = [3, 7, 12]  # positions whose uint64 no Iceberg long holds


def _config(path: Path, url: str, options: dict[str, str], warehouse: Path) -> Path:
    listed = ", ".join(f'{k} = "{v}"' for k, v in options.items())
    path.write_text(
        f"""
[gateway]
data_dir = "{url}"
object_store = {{ {listed} }}

[[sources]]
name = "k"
kind = "kafka"
bootstrap_servers = "127.0.0.1:9"
topics = ["t"]

[[sinks]]
name = "ice"
kind = "iceberg"
topics = ["t"]

[sinks.catalog]
type = "sql"
uri = "sqlite:///{warehouse}/catalog.db"
warehouse = "{warehouse.as_uri()}"
"""
    )
    return path


def _feed(cfg: ThalwegConfig) -> int:
    """One pass of sink ``ice`` as the gateway runs it on a bucket lane (with the
    mirror); the rows it wrote."""
    layout = LaneLayout(cfg.gateway.data_dir)
    mirror = LaneMirror(layout, ObjectStore(cfg.gateway.object_store))

    async def run() -> int:
        [feeder] = build_feeders(
            cfg, layout, MetadataColumns(cfg.gateway.metadata_prefix), mirror=mirror
        )
        try:
            await feeder.open()
            return (await feeder.pass_once(final=True)).rows
        finally:
            await feeder.close()

    return asyncio.run(run())


def _poisoned_lane(moto: MotoServer, cache: Path) -> tuple[str, ObjectStore]:
    """Topic ``t``'s 20 records, those at BAD holding a uint64 no Iceberg long holds,
    written in ``cache`` and put in a bucket of their own: its URL and store."""
    values = pa.array([2**64 - 1 if p in BAD else p for p in range(20)], pa.uint64())
    write_segment(cache, "t", 0, range(20), 0, payload={"v": values})
    url = f"s3://{bucket(moto)}/lanes"
    store = open_store(moto, url)
    for f in sorted(cache.glob("*/topic=t/partition=0/*.parquet")):
        store.put_new(str(f.relative_to(cache).with_name(object_name(f.name, 1))), f)
    return url, store


def test_a_sinks_refused_records_are_kept_in_the_bucket_and_fetched_back(
    moto: MotoServer, tmp_path: Path
) -> None:
    cache, warehouse = tmp_path / "cache", tmp_path / "iceberg"
    warehouse.mkdir()
    url, store = _poisoned_lane(moto, cache)
    here = _config(tmp_path / "here.toml", url, store_cfg(moto, url, cache), warehouse)
    cfg = load_config(here)

    assert _feed(cfg) == 20  # handed to the sink; the destination refused three
    columns = MetadataColumns()
    keys = sorted(k for k in store.listing("refused/") if k.endswith(".parquet"))
    assert keys and all(k.startswith("refused/ice/dlq/topic=t/partition=0/") for k in keys)
    refused = [
        p
        for k in keys
        for p in pq.read_table(pa.BufferReader(store.read(k) or b"")).column(columns.position)
    ]
    assert [p.as_py() for p in refused] == BAD

    # verify away from the gateway's host (an empty cache there): the refused records
    # are accounted for from the bucket, not missing.
    elsewhere = tmp_path / "elsewhere"
    there = _config(tmp_path / "there.toml", url, store_cfg(moto, url, elsewhere), warehouse)
    args = ["--output", "json", "verify", "-c", str(there), "--no-broker", "--sink", "ice"]
    done = CliRunner().invoke(cli, args, obj={})
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["sinks"]["ice"]["refused"] == len(BAD), report
    assert report["sinks"]["ice"]["missing"] == 0, report

    # The gateway's host loses its cache's dead-letter lane: the feeder's open fetches
    # it back before its recheck, so nothing is refused, fed or set aside again.
    lane = SinkDeadLetters(LaneLayout(cache), "ice", columns)
    for f in (cache / "refused").rglob("*.parquet"):
        f.unlink()
    assert lane.held("t", 0).tolist() == []
    assert _feed(cfg) == 0
    assert lane.held("t", 0).tolist() == BAD
    done = CliRunner().invoke(cli, [*args[:4], str(here), *args[5:]], obj={})
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["sinks"]["ice"]["refused"] == len(BAD)


def test_every_replica_fetches_the_sinks_dead_letter_lanes(
    moto: MotoServer, tmp_path: Path
) -> None:
    """A replica that does not feed the sink serves its refused records all the same:
    its lane sync fetches them (``LaneSync.refused``) and its catalog lists the sink."""
    from thalweg.engine.jobs.lane_sync import LaneSync
    from thalweg.group.owners import OwnerDirectory
    from thalweg.lane.read.catalog import LaneCatalog
    from thalweg.lane.read.live import LiveTail

    url = f"s3://{bucket(moto)}/lanes"
    store = open_store(moto, url)
    feeder_host = tmp_path / "feeder"
    name = "00000000000000000003-00000000000000000007.parquet"
    rows = pa.table({MetadataColumns().position: pa.array([3, 7], pa.int64())})
    local = feeder_host / "refused" / "db" / "dlq" / "topic=t" / "partition=0" / name
    local.parent.mkdir(parents=True)
    pq.write_table(rows, local)
    assert LaneMirror(LaneLayout(feeder_host), store).sync_refused("db") == (1, 0)

    replica = LaneLayout(tmp_path / "replica")
    sync = LaneSync(
        LaneMirror(replica, store),
        lambda: [],
        lambda: [],
        OwnerDirectory(),
        1.0,
        sinks=lambda: ["db", "other"],
    )
    assert sync.refused() == 1
    assert sync.refused() == 0  # fetched once
    assert SinkDeadLetters(replica, "db", MetadataColumns()).held("t", 0).tolist() == [3, 7]
    catalog = LaneCatalog(replica, MetadataColumns(), LiveTail())
    assert catalog.dead_letter_sinks() == ["db"]


def test_twg_recover_on_a_bucket_lane_fetches_it_and_keeps_the_refused_records_there(
    moto: MotoServer, tmp_path: Path
) -> None:
    """``twg recover`` on a host that never saw the lane: it fetches the bucket's lane
    into its cache, feeds the sink, and puts what the destination refused into the
    bucket; a second host's ``twg recover`` fetches them back and sets nothing aside
    again."""
    warehouse = tmp_path / "iceberg"
    warehouse.mkdir()
    writer = tmp_path / "writer"
    url, store = _poisoned_lane(moto, writer)

    def recover(host: str) -> dict[str, object]:
        toml = _config(
            tmp_path / f"{host}.toml", url, store_cfg(moto, url, tmp_path / host), warehouse
        )
        args = ["--output", "json", "recover", "-c", str(toml), "--sink", "ice"]
        done = CliRunner().invoke(cli, args, obj={})
        assert done.exit_code == 0, done.output
        return dict(json.loads(done.output))

    first = recover("one")
    assert (first["rows"], first["lag_after"]) == (20, 0), first
    keys = sorted(k for k in store.listing("refused/") if k.endswith(".parquet"))
    assert keys and all(k.startswith("refused/ice/dlq/topic=t/partition=0/") for k in keys)
    second = recover("two")
    assert (second["rows"], second["positions"]) == (0, 0), second
    held = SinkDeadLetters(LaneLayout(tmp_path / "two"), "ice", MetadataColumns())
    assert held.held("t", 0).tolist() == BAD
