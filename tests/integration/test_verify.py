"""``twg verify`` against a real lane and real sinks (PostgreSQL, Iceberg on its SQL
catalog, Arrow IPC files): clean after a run, then each planted fault named — a raw
segment missing (a gap), the lane's first segment missing (its start above its origin
record), a segment written twice (an overlap), a decoded twin missing (an error: readers
miss its records), an interrupted write left on a stopped gateway, an orphan decoded
file, a sink row deleted, a sink file lost from under its coverage store, a sink's table
dropped, the lane's newest segment lost under the group's commit (a commit ahead of the
lane), a topic the broker holds and the lane never did — with exit code 1 and the JSON
report (``--output json`` before or after the command) naming each, per partition. And
a store ahead of the destination where the lane gives the sink no row (an Iceberg
sink's first flush of dead letters only): a warning, gone after the feeder's next
start."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from tests.conftest import RunningGateway
from tests.helpers import produce_aio, produce_json, safe_count, wait_until, write_segment
from tests.integration.test_object_store import bucket, open_store, store_cfg
from tests.moto_server import MotoServer
from tests.postgres_server import PostgresServer
from thalweg.cli.main import cli
from thalweg.config.models import KafkaSourceConfig, ThalwegConfig
from thalweg.embedded import TansuBroker
from thalweg.lane.layout import Lane, LaneLayout, segment_name
from thalweg.lane.remote.mirror import object_name
from thalweg.recovery.coverage import CoverageStore
from thalweg.verify import Report, verify

pytestmark = pytest.mark.integration

N = 1200


def _codes(report: Report) -> set[tuple[str, str]]:
    return {(f.code, f.where) for f in report.findings}


@pytest.fixture
def landed(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    postgres: PostgresServer,
    tmp_path: Path,
) -> tuple[ThalwegConfig, str, Path, str]:
    """A topic of two partitions ingested in segments of 100 records — every 50th
    record does not decode — and fed to three sinks; the gateway stopped."""
    topic = topic_factory(partitions=2, prefix="verify")
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "log_level": 2})
    for i in range(N):
        value = b"{broken" if i % 50 == 7 else json.dumps({"n": i}).encode()
        p.produce(topic, value, partition=i % 2)
    assert p.flush(30) == 0
    data = tmp_path / "lane"
    schema = f"s_{topic.replace('-', '_')}"
    sinks: list[dict[str, Any]] = [
        {"name": "lake", "kind": "iceberg", "topics": [topic], "commit_interval_s": 0.3},
        {
            "name": "db",
            "kind": "postgres",
            "topics": [topic],
            "dsn": postgres.dsn,
            "schema_name": schema,
            "commit_interval_s": 0.3,
        },
        {"name": "files", "kind": "arrow_ipc", "topics": [topic], "commit_interval_s": 0.3},
    ]
    rg = gateway_factory([topic], data_dir=data, sinks=sinks, raw_lane={"roll_rows": 100})
    rg.wait_durable(topic, {0: N // 2, 1: N // 2})
    whole = {(topic, p, 0): [(0, N // 2)] for p in (0, 1)}
    for sink in ("lake", "db", "files"):
        wait_until(
            lambda s=sink: safe_count(lambda: int(CoverageStore(data, s).snapshot() == whole)) == 1,
            60,
            f"sink {sink} holding every record",
        )
    rg.stop()
    return rg.gateway.cfg, topic, data, schema


def test_a_sound_run_verifies_clean_and_each_planted_fault_is_named(
    landed: tuple[ThalwegConfig, str, Path, str],
    postgres: PostgresServer,
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    cfg, topic, data, schema = landed
    clean = verify(cfg)
    assert clean.ok, clean.as_text()
    assert not clean.findings, clean.as_text()
    assert {p.partition: p.rows for p in clean.partitions} == {0: N // 2, 1: N // 2}
    assert {p.partition: p.committed for p in clean.partitions} == {0: N // 2, 1: N // 2}
    good = N - len([i for i in range(N) if i % 50 == 7])
    for name in ("lake", "db", "files"):
        s = clean.sinks[name]
        assert (s["records_checked"], s["missing"], s["duplicates"]) == (good, 0, 0), s

    layout = LaneLayout(data)
    p0 = layout.segments(Lane.RAW, topic, 0)
    p1 = layout.segments(Lane.RAW, topic, 1)
    # A raw segment lost (and its twins): a gap, and every sink covering it is ahead.
    for lane in (Lane.RAW, Lane.DECODED, Lane.DLQ):
        (layout.partition_dir(lane, topic, 0) / p0[2].path.name).unlink(missing_ok=True)
    # The first raw segment lost: the lane now starts later, nothing inside it says so
    # (the broker still holds offset 0; the lane's origin record says where it began).
    for lane in (Lane.RAW, Lane.DECODED, Lane.DLQ):
        (layout.partition_dir(lane, topic, 0) / p0[0].path.name).unlink(missing_ok=True)
    # An interrupted write two minutes old, on a stopped gateway: nothing will finish it.
    stale = layout.partition_dir(Lane.RAW, topic, 0) / f"{p0[1].path.name}.tmp-1-0"
    stale.write_bytes(b"")
    os.utime(stale, (time.time() - 120, time.time() - 120))
    # A raw segment written twice under an overlapping name.
    twin = p1[1]
    shutil.copy(
        twin.path, twin.path.with_name(f"{twin.first + 1:020d}-{twin.last + 1:020d}.parquet")
    )
    # A decoded twin lost; a decoded file whose raw file never landed, two minutes ago
    # (a younger one is a write in flight: its raw file is renamed next).
    (layout.partition_dir(Lane.DECODED, topic, 1) / p1[3].path.name).unlink()
    dec = layout.partition_dir(Lane.DECODED, topic, 1)
    orphan = dec / f"{10**9:020d}-{10**9 + 1:020d}.parquet"
    shutil.copy(dec / p1[4].path.name, orphan)
    os.utime(orphan, (time.time() - 120, time.time() - 120))
    # A row of partition 1 deleted from Postgres.
    table = topic.replace("-", "_")
    postgres.query(
        f'DELETE FROM "{schema}"."{table}" WHERE "_twg_source_partition" = 1 '
        f'AND "_twg_position" = 4 RETURNING 1'
    )
    # An Arrow IPC file of partition 1 lost from under the sink's coverage store.
    files = sorted((data / "sinks" / "files" / f"topic={topic}" / "partition=1").glob("*.arrow"))
    files[0].unlink()
    # Partition 1's newest segment lost: the group's commit is now ahead of the lane.
    for lane in (Lane.RAW, Lane.DECODED, Lane.DLQ):
        (layout.partition_dir(lane, topic, 1) / p1[-1].path.name).unlink(missing_ok=True)

    report = verify(cfg)
    assert not report.ok
    codes = _codes(report)
    for code, where in [
        ("gap", f"{topic}[0]"),
        ("start_missing", f"{topic}[0]"),
        ("temp_file", f"{topic}[0]"),
        ("sink_ahead", f"sink db: {topic}[0]"),
        ("sink_ahead", f"sink lake: {topic}[0]"),
        ("overlap", f"{topic}[1]"),
        ("twin_missing", f"{topic}[1]"),
        ("orphan", f"{topic}[1]"),
        ("sink_missing", f"sink db: {topic}[1]"),
        ("store_ahead", f"sink files: {topic}[1]"),
        ("commit_ahead", f"{topic}[1]"),
    ]:
        assert (code, where) in codes, f"{code} at {where} not named:\n{report.as_text()}"
    levels = {(f.code, f.where): f.level for f in report.findings}
    for code, where in [
        ("twin_missing", f"{topic}[1]"),
        ("start_missing", f"{topic}[0]"),
        ("temp_file", f"{topic}[0]"),
    ]:
        assert levels[(code, where)] == "error", report.as_text()
    assert report.stopped and not report.unchecked
    starts = [f.message for f in report.findings if f.code == "start_missing"]
    assert starts == [
        f"positions 0-{p0[0].last} are in no raw segment: the lane should start at 0 (its "
        f"origin record says 0) and its first segment covers from {p0[1].first} (the first "
        "segments were removed or never landed)"
    ]

    # The sink's table dropped: every covered record missing, named as such.
    postgres.query(f'DROP TABLE "{schema}"."{table}"')
    dropped = verify(cfg, sink="db")
    assert ("table_missing", f"sink db: {topic}[1]") in _codes(dropped), dropped.as_text()

    # The command: exit 1, the JSON report names every finding per partition.
    config = tmp_path / "verify.toml"
    config.write_text(_toml(cfg, topic, postgres, schema))
    for args in (
        ["--output", "json", "verify", "--config", str(config)],
        ["verify", "--config", str(config), "--topic", topic, "--output", "json"],
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1, result.output
        body = json.loads(result.output)
        assert body["ok"] is False and body["errors"] >= 12
        found = {(f["code"], f["where"]) for f in body["findings"]}
        assert {
            ("gap", f"{topic}[0]"),
            ("start_missing", f"{topic}[0]"),
            ("twin_missing", f"{topic}[1]"),
            ("overlap", f"{topic}[1]"),
            ("orphan", f"{topic}[1]"),
            ("commit_ahead", f"{topic}[1]"),
        } <= found, body
    result = CliRunner().invoke(cli, ["verify", "--config", str(config), "--sink", "nope"])
    assert result.exit_code == 2 and "no [[sinks]] named 'nope'" in result.output

    # A topic the source names and the broker holds records of, never ingested: owed, a
    # warning per partition with records. Then its partition 0 ingested, its partition
    # 1 not (a blind spot of the assignment): partition 1 is an error.
    other = topic_factory(partitions=2, prefix="verify-never")
    produce_json(broker.bootstrap, other, [{"n": i} for i in range(7)], partition=0)
    produce_json(broker.bootstrap, other, [{"n": i} for i in range(3)], partition=1)
    source = cfg.sources[0]
    wider = cfg.model_copy(
        update={"sources": [source.model_copy(update={"topics": [topic, other]})]}
    )
    owed = verify(wider, topic=other)
    assert owed.ok, owed.as_text()
    assert [(f.code, f.where, f.level) for f in owed.findings] == [
        ("partition_not_yet", f"{other}[0]", "warning"),
        ("partition_not_yet", f"{other}[1]", "warning"),
    ], owed.as_text()
    write_segment(data, other, 0, range(7), 0)
    never = verify(wider, topic=other)
    assert not never.ok
    assert [(f.code, f.where, f.level) for f in never.findings] == [
        ("partition_missing", f"{other}[1]", "error")
    ], never.as_text()
    assert "offsets 0-2" in never.findings[0].message


def test_an_iceberg_sink_whose_first_flush_had_no_rows_is_not_called_ahead(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    """Three dead letters, then rows: the sink's first flush has no row to make its table
    from, so the table's own record never names those three positions while the store
    does. Nothing is missing: a warning, not an error (a gap holding rows stays one: the
    Arrow IPC fault above). The feeder's next start writes them into the table's record."""
    topic = topic_factory(partitions=1, prefix="verify")
    data = tmp_path / "lane"
    produce_aio(broker.bootstrap, topic, [(None, b"{broken", [], None)] * 3)
    lake = {"name": "lake", "kind": "iceberg", "topics": [topic], "commit_interval_s": 0.3}
    group = f"g-{topic}"
    rg = gateway_factory([topic], data_dir=data, sinks=[lake], group_id=group)
    first = {(topic, 0, 0): [(0, 3)]}
    wait_until(lambda: _store(data) == first, 60, "the dead letters covered")
    n = produce_json(broker.bootstrap, topic, ({"n": i} for i in range(50)))
    whole = {(topic, 0, 0): [(0, 3 + n)]}
    wait_until(lambda: _store(data) == whole, 60, "the rows covered")
    rg.stop()
    where = f"sink lake: {topic}[0]"
    report = verify(rg.gateway.cfg)
    assert report.ok, report.as_text()
    assert _codes(report) == {("store_ahead_no_rows", where)}, report.as_text()
    assert report.sinks["lake"]["records_checked"] == n

    rg = gateway_factory([topic], data_dir=data, sinks=[lake], group_id=group)
    wait_until(
        lambda: not _codes(verify(rg.gateway.cfg, broker=False)),
        60,
        "the feeder's start recording the three positions in the table",
    )
    rg.stop()


def test_a_bucket_lanes_upsert_sink_is_folded_from_the_bucket_not_the_local_cache(
    moto: MotoServer, tmp_path: Path
) -> None:
    """verify checks a bucket lane from a copy of the bucket: the fold an upsert sink is
    checked against comes from that copy too, so verify run away from the gateway's
    host (its cache empty there) finds what it finds there."""
    cache, warehouse = tmp_path / "cache", tmp_path / "iceberg"
    warehouse.mkdir()
    write_segment(cache, "t", 0, range(5), 0, keys=[b"a", b"b", b"a", b"c", b"b"])
    write_segment(cache, "t", 0, range(5, 7), 5, keys=[b"a", b"d"])
    sink = f"""
[[sinks]]
name = "ice"
kind = "iceberg"
topics = ["t"]
mode = "upsert"

[sinks.catalog]
type = "sql"
uri = "sqlite:///{warehouse}/catalog.db"
warehouse = "{warehouse.as_uri()}"
"""
    source = """
[[sources]]
name = "k"
kind = "kafka"
bootstrap_servers = "127.0.0.1:9"
topics = ["t"]
"""
    local = tmp_path / "local.toml"
    local.write_text(f'[gateway]\ndata_dir = "{cache}"\n{source}{sink}')
    landed = CliRunner().invoke(cli, ["recover", "-c", str(local), "--sink", "ice"], obj={})
    assert landed.exit_code == 0, landed.output  # each key's newest: a, b, c, d
    url = f"s3://{bucket(moto)}/lanes"
    store = open_store(moto, url)
    for f in sorted(cache.glob("*/topic=t/partition=0/*.parquet")):
        store.put_new(str(f.relative_to(cache).with_name(object_name(f.name, 1))), f)
    elsewhere = tmp_path / "elsewhere"  # verify away from the gateway's host: no cache
    remote = tmp_path / "remote.toml"
    options = ", ".join(f'{k} = "{v}"' for k, v in store_cfg(moto, url, elsewhere).items())
    remote.write_text(
        f'[gateway]\ndata_dir = "{url}"\nobject_store = {{ {options} }}\n{source}{sink}'
    )
    args = ["--output", "json", "verify", "-c", str(remote), "--no-broker"]
    done = CliRunner().invoke(cli, args, obj={})
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["sinks"]["ice"]["records_checked"] == 4, report
    assert [f["code"] for f in report["findings"]] == [], report["findings"]


def _store(data: Path) -> object:
    """The sink ``lake``'s coverage store, or None while it cannot be read."""
    try:
        return CoverageStore(data, "lake").snapshot()
    except (OSError, ValueError):
        return None


def _toml(cfg: ThalwegConfig, topic: str, pg: PostgresServer, schema: str) -> str:
    src = cfg.sources[0]
    bootstrap, group = getattr(src, "bootstrap_servers"), getattr(src, "group_id")  # noqa: B009
    return f"""
[gateway]
data_dir = "{cfg.gateway.data_dir}"

[[sources]]
name = "test"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "{group}"

[[sinks]]
name = "db"
kind = "postgres"
topics = ["{topic}"]
dsn = "{pg.dsn}"
schema_name = "{schema}"

[[sinks]]
name = "files"
kind = "arrow_ipc"
topics = ["{topic}"]

[recovery]
poll_interval_s = 0.2
"""


def _rewrite(path: Path, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> None:
    """``path``'s rows changed by ``change``, written back under the same schema (its
    footer's metadata kept): a segment damaged behind the lane's back."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    pq.write_table(pa.Table.from_pylist(change(table.to_pylist()), schema=table.schema), path)


def test_deep_finds_records_held_reshaped_or_dropped_that_positions_alone_cannot(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    tmp_path: Path,
) -> None:
    """Records with null, empty and set keys, duplicate and null-valued headers and their
    own timestamps, ingested and stopped: ``--deep`` compares every one clean. Then, in
    the raw lane, one value changed, one header dropped, one null key stored empty, one
    timestamp shifted, and one record removed from its segment and its twin (what a
    compacted offset looks like, so the shallow check cannot tell): the shallow check
    passes, ``--deep`` names each offset with the field that differs, ``--partition``
    and ``--since`` bound it, and the command exits 1."""
    topic = topic_factory(partitions=2, prefix="deep")
    base = 1_700_000_000_000
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "log_level": 2})
    for i in range(600):
        key = None if i % 3 == 0 else b"" if i % 3 == 1 else f"k{i}".encode()
        headers = [("h", str(i).encode()), ("h", None), ("z", b"")] if i % 4 == 0 else None
        p.produce(
            topic,
            json.dumps({"n": i}).encode(),
            key=key,
            partition=i % 2,
            headers=headers,
            timestamp=base + i,
        )
    assert p.flush(30) == 0
    data = tmp_path / "lane"
    rg = gateway_factory([topic], data_dir=data, raw_lane={"roll_rows": 100})
    rg.wait_durable(topic, {0: 300, 1: 300})
    rg.stop()
    cfg = rg.gateway.cfg

    clean = verify(cfg, deep=True)
    assert clean.ok and not clean.findings, clean.as_text()
    for part in (0, 1):
        assert clean.deep[f"{topic}[{part}]"] == {
            "from": 0,
            "to": 300,
            "compared": 300,
            "differ": 0,
            "missing": 0,
            "not_retained": 0,
            "complete": True,
        }

    layout = LaneLayout(data)
    cols = cfg.gateway.metadata_prefix
    seg0 = layout.segments(Lane.RAW, topic, 0)[1]  # offsets 100-199 of partition 0

    def reshape(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        by = {r[f"{cols}source_offset"]: r for r in rows}
        by[120][f"{cols}source_value"] = b'{"n": -1}'
        by[124][f"{cols}source_headers"] = by[124][f"{cols}source_headers"][:-1]
        assert by[126][f"{cols}source_key"] is None  # record 252: 252 % 3 == 0
        by[126][f"{cols}source_key"] = b""
        by[131][f"{cols}source_timestamp"] = by[130][f"{cols}source_timestamp"]
        return rows

    _rewrite(seg0.path, reshape)
    seg1 = layout.segments(Lane.RAW, topic, 1)[2]  # offsets 200-299 of partition 1
    for lane in (Lane.RAW, Lane.DECODED):
        _rewrite(
            layout.partition_dir(lane, topic, 1) / seg1.path.name,
            lambda rows: [r for r in rows if r[f"{cols}source_offset"] != 250],
        )

    shallow = verify(cfg)
    assert shallow.ok, shallow.as_text()  # positions alone: a compacted offset
    deep = verify(cfg, deep=True)
    assert not deep.ok
    found = {(f.code, f.where): f.message for f in deep.findings}
    assert set(found) == {("deep_mismatch", f"{topic}[0]"), ("deep_missing", f"{topic}[1]")}
    assert "4 record(s)" in found[("deep_mismatch", f"{topic}[0]")]
    assert (
        "offsets 120 (value), 124 (headers), 126 (key), 131 (timestamp)"
        in found[("deep_mismatch", f"{topic}[0]")]
    )
    assert "offsets 250" in found[("deep_missing", f"{topic}[1]")]

    # Bounded: one partition; or only the segments from a time on (partition 0's records
    # 100.. were sent at base + 200 ..: the segment holding the changes is not read).
    one = verify(cfg, deep=True, partition=1)
    assert set(one.deep) == {f"{topic}[1]"}
    assert {f.code for f in one.findings} == {"deep_missing"}
    later = verify(cfg, deep=True, since_ms=base + 400)
    assert later.deep[f"{topic}[0]"]["from"] == 200, later.as_text()
    assert {f.code for f in later.findings} == {"deep_missing"}  # partition 1's 250 stays

    config = tmp_path / "deep.toml"
    src = cfg.sources[0]
    config.write_text(
        f'[gateway]\ndata_dir = "{data}"\n\n[[sources]]\nname = "test"\nkind = "kafka"\n'
        f'bootstrap_servers = "{getattr(src, "bootstrap_servers")}"\ntopics = ["{topic}"]\n'  # noqa: B009
        f'group_id = "{getattr(src, "group_id")}"\n'  # noqa: B009
    )
    result = CliRunner().invoke(
        cli, ["verify", "-c", str(config), "--deep", "--partition", "0", "--output", "json"]
    )
    assert result.exit_code == 1, result.output
    body = json.loads(result.output)
    assert [f["code"] for f in body["findings"]] == ["deep_mismatch"]
    assert body["deep"][f"{topic}[0]"]["differ"] == 4
    result = CliRunner().invoke(cli, ["verify", "-c", str(config), "--since", "1h"])
    assert result.exit_code == 2 and "add --deep" in result.output

    # A range the broker stops answering in (here: a segment said to hold 300-399 of a
    # log that ends at 300) ends once the broker has been quiet a while, naming the
    # offset it waited at, and the report lists the check as not done.
    from thalweg.lane.layout import Segment
    from thalweg.records.columns import MetadataColumns
    from thalweg.verify.deep import DeepRange, check_partition, report_partition

    assert isinstance(src, KafkaSourceConfig)
    past = Segment(300, 399, layout.segments(Lane.RAW, topic, 1)[-1].path)
    plan = DeepRange(topic, 1, 300, 400, (past,))
    waited = asyncio.run(check_partition(src, MetadataColumns(cols), plan, idle_s=1.0))
    assert waited.incomplete is not None and "from offset 300" in waited.incomplete
    partial = Report()
    report_partition(f"{topic}[1]", waited, partial)
    assert partial.ok and [f.code for f in partial.unchecked] == ["deep_incomplete"]

    # A partition whose broker log no longer continues the lane (held diverged by the
    # gateway) is not compared: its offsets name other records now.
    from thalweg.lane.epochs import Divergence, mark_diverged

    mark_diverged(layout, Divergence(topic, 0, 0, "record_mismatch", 300, 0, 300, "planted"))
    held = verify(cfg, deep=True, partition=0)
    assert [(f.code, f.level) for f in held.findings] == [("deep_diverged", "warning")]
    result = CliRunner().invoke(cli, ["verify", "-c", str(config), "--deep", "--since", "soon"])
    assert result.exit_code == 2 and "ISO 8601" in result.output


def remote_config(moto: MotoServer, url: str, tmp_path: Path) -> Path:
    """A configuration of the bucket lane at ``url`` (topic ``t``) on a host of its own
    (its cache ``tmp_path/elsewhere``): verify as an operator away from the gateway."""
    remote = tmp_path / "remote.toml"
    options = ", ".join(
        f'{k} = "{v}"' for k, v in store_cfg(moto, url, tmp_path / "elsewhere").items()
    )
    remote.write_text(
        f'[gateway]\ndata_dir = "{url}"\nobject_store = {{ {options} }}\n'
        '[[sources]]\nname = "k"\nkind = "kafka"\nbootstrap_servers = "127.0.0.1:9"\n'
        'topics = ["t"]\n'
    )
    return remote


def test_a_bucket_lanes_leftovers_are_named_and_the_resolved_lane_checked(
    moto: MotoServer, tmp_path: Path
) -> None:
    """A bucket holding, beside its lane, a raw object of an older generation that a
    newer one supersedes (a zombie's, or a crashed member's its successor wrote again)
    and a decoded object whose raw PUT never landed: each named, a warning (readers
    resolve past both), and the lane as readers resolve it verified clean."""
    cache = tmp_path / "cache"
    write_segment(cache, "t", 0, range(5), 0)
    write_segment(cache, "t", 0, range(5, 9), 5)
    url = f"s3://{bucket(moto)}/lanes"
    store = open_store(moto, url)
    for f in sorted(cache.glob("*/topic=t/partition=0/*.parquet")):
        store.put_new(str(f.relative_to(cache).with_name(object_name(f.name, 2))), f)
    first = (
        cache
        / "raw"
        / "topic=t"
        / "partition=0"
        / "00000000000000000000-00000000000000000004.parquet"
    )
    store.put_new(f"raw/topic=t/partition=0/{object_name(first.name, 1)}", first)
    twin = cache / "decoded" / "topic=t" / "partition=0" / first.name
    store.put_new(
        f"decoded/topic=t/partition=0/{object_name(segment_name(9, 11), 2)}",
        twin,
    )
    remote = remote_config(moto, url, tmp_path)
    done = CliRunner().invoke(
        cli, ["--output", "json", "verify", "-c", str(remote), "--no-broker"], obj={}
    )
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert {(f["code"], f["where"], f["level"]) for f in report["findings"]} == {
        ("superseded_objects", "t[0]", "warning"),
        ("orphan_object", "t[0]", "warning"),
    }, report["findings"]
    assert [p["rows"] for p in report["partitions"]] == [9]


def test_a_bucket_lanes_lost_first_object_is_named_against_the_origin_the_bucket_keeps(
    moto: MotoServer, tmp_path: Path
) -> None:
    """A bucket lane begun above the broker's log start (as at ``latest`` or a group
    commit) whose first raw object is lost: the origin record went up with the first
    object it published, so verify — from the bucket, on a host that never saw the
    writer's cache — names the missing start (exit 1), and finds the sound lane clean
    (a record left by a member killed before its first object is replaced, not kept)."""
    from thalweg.lane.remote.mirror import LaneMirror
    from thalweg.lane.remote.origin_sync import origin_rel

    cache = tmp_path / "cache"
    write_segment(cache, "t", 0, range(50, 60), 50)  # the lane begins at 50, on purpose
    write_segment(cache, "t", 0, range(60, 70), 60)
    url = f"s3://{bucket(moto)}/lanes"
    store = open_store(moto, url)
    # A member killed between its origin record's PUT and its first object's left one
    # naming 10: with no raw object there, this lane's record replaces it.
    store.put(origin_rel("t", 0), b'{"position": 10}')
    mirror = LaneMirror(LaneLayout(cache), store)
    for seg in LaneLayout(cache).segments(Lane.RAW, "t", 0):
        mirror.publish("t", 0, seg.path.name, 1, lambda: None)
    assert json.loads(store.read(origin_rel("t", 0)) or b"{}") == {"position": 50}
    remote = remote_config(moto, url, tmp_path)

    def run() -> tuple[int, list[tuple[str, str, str]]]:
        shutil.rmtree(tmp_path / "elsewhere", ignore_errors=True)  # a host of its own
        done = CliRunner().invoke(
            cli, ["verify", "-c", str(remote), "--no-broker", "--output", "json"]
        )
        found = json.loads(done.output)["findings"]
        return done.exit_code, [(f["code"], f["where"], f["level"]) for f in found]

    assert run() == (0, [])
    store.delete([f"raw/topic=t/partition=0/{object_name(segment_name(50, 59), 1)}"])
    code, found = run()
    assert code == 1 and ("start_missing", "t[0]", "error") in found, found


def test_a_twin_rebuilt_after_its_raw_object_went_up_alone_is_put_beside_it(
    moto: MotoServer, tmp_path: Path
) -> None:
    """A bucket lane whose decoded twin write failed: the raw object went up alone, and
    verify from the bucket names the twin missing. The rebuilt twin, put with
    ``publish_twins``, lands under the raw object's generation and verify is clean; a
    second call puts nothing, and a segment whose raw object is not in the bucket is
    left to its own publish."""
    from thalweg.lane.remote.mirror import LaneMirror

    cache = tmp_path / "cache"
    write_segment(cache, "t", 0, range(5), 0)
    write_segment(cache, "t", 0, range(5, 9), 5)
    url = f"s3://{bucket(moto)}/lanes"
    store = open_store(moto, url)
    for f in sorted((cache / "raw").glob("topic=t/partition=0/*.parquet")):
        store.put_new(str(f.relative_to(cache).with_name(object_name(f.name, 3))), f)
    second = segment_name(5, 8)
    store.put_new(
        f"decoded/topic=t/partition=0/{object_name(segment_name(0, 4), 3)}",
        cache / "decoded" / "topic=t" / "partition=0" / segment_name(0, 4),
    )
    remote = remote_config(moto, url, tmp_path)
    args = ["--output", "json", "verify", "-c", str(remote), "--no-broker"]
    before = json.loads(CliRunner().invoke(cli, args, obj={}).output)
    assert [(f["code"], f["level"]) for f in before["findings"]] == [("twin_missing", "error")]
    mirror = LaneMirror(LaneLayout(cache), store)
    assert mirror.publish_twins("t", 0, second) == 1
    assert store.exists(f"decoded/topic=t/partition=0/{object_name(second, 3)}")
    assert mirror.publish_twins("t", 0, second) == 0  # there already
    assert mirror.publish_twins("t", 0, segment_name(9, 12)) == 0  # no raw object
    done = CliRunner().invoke(cli, args, obj={})
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["findings"] == []
