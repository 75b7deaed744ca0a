"""``kind = "arrow_ipc"``: Arrow IPC files dropped into a directory, streamed by the
gateway as they appear — each file a partition, its rows' numbers the positions, served
over Flight with its locators — and, after a restart or a SIGKILL, resumed from the
manifest: every row once."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import thalweg_client
from tests.conftest import RunningGateway
from tests.helpers import kill_at, run_until, start_stream, stream_config

pytestmark = pytest.mark.integration

P = "_twg_"


def rows(n: int, first: int = 0) -> pa.Table:
    ids = list(range(first, first + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]})


def drop(directory: Path, name: str, table: pa.Table, batch: int = 700) -> None:
    """Write under a hidden temp name, then rename into place (what a producer should
    do: the source never reads a half-written file)."""
    tmp = directory / f".{name}.tmp"
    with pa.ipc.new_stream(str(tmp), table.schema) as w:
        for b in table.to_batches(max_chunksize=batch):
            w.write_batch(b)
    os.replace(tmp, directory / name)


def raw_rows(data: Path, topic: str) -> list[tuple[int, int]]:
    files = sorted((data / "raw" / f"topic={topic}").rglob("*.parquet"))
    keys: list[tuple[int, int]] = []
    for f in files:
        t = pq.read_table(f, columns=[f"{P}source_partition", f"{P}source_offset"])
        keys += list(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True))
    return keys


def source(drops: Path, topic: str) -> dict[str, object]:
    return {
        "kind": "arrow_ipc",
        "name": "drops",
        "topics": [topic],
        "directory": str(drops),
        "poll_interval_s": 0.1,
        "settle_s": 0,
    }


def test_dropped_files_are_streamed_served_and_resumed_after_a_restart(
    tmp_path: Path, gateway_factory: Callable[..., RunningGateway]
) -> None:
    drops, data, topic = tmp_path / "drops", tmp_path / "lane", "ipc-drops"
    drops.mkdir()
    drop(drops, "a.arrows", rows(1_000))
    gw = gateway_factory([], sources=[source(drops, topic)], data_dir=data)
    gw.wait_durable(topic, {0: 1_000})
    drop(drops, "b.arrows", rows(500, 5_000))
    gw.wait_durable(topic, {0: 1_000, 1: 500})

    with thalweg_client.connect(gw.flight_url) as client:
        read = client.read(topic)
    read = read.sort_by([(f"{P}source_partition", "ascending"), (f"{P}source_offset", "ascending")])
    assert read["id"].to_pylist() == list(range(1_000)) + list(range(5_000, 5_500))
    uris = dict(
        zip(
            read[f"{P}source_partition"].to_pylist(),
            read[f"{P}source_message_id"].to_pylist(),
            strict=True,
        )
    )
    assert uris == {
        0: (drops / "a.arrows").as_uri().encode(),
        1: (drops / "b.arrows").as_uri().encode(),
    }
    gw.stop()

    # While it is down a file arrives; after the restart only that file is read.
    drop(drops, "c.arrows", rows(200, 9_000))
    gw2 = gateway_factory([], sources=[source(drops, topic)], data_dir=data)
    gw2.wait_durable(topic, {0: 1_000, 1: 500, 2: 200})
    gw2.stop()
    keys = raw_rows(data, topic)
    assert len(keys) == len(set(keys)) == 1_700
    manifest = json.loads((data / "sources" / "drops" / "manifest.json").read_text())
    assert [(e["partition"], e["committed"], e["state"]) for e in manifest["files"]] == [
        (0, 1_000, "done"),
        (1, 500, "done"),
        (2, 200, "done"),
    ]


def test_a_gateway_killed_while_reading_drops_resumes_with_every_row_once(tmp_path: Path) -> None:
    drops, data, topic = tmp_path / "drops", tmp_path / "lane", "ipc-kill"
    drops.mkdir()
    source = f"""kind = "arrow_ipc"
name = "drops"
topics = ["{topic}"]
directory = "{drops}"
poll_interval_s = 0.1
settle_s = 0
max_records_per_s = 40000
max_poll_records = 2000"""
    config = stream_config(tmp_path / "thalweg.toml", data, source, roll_rows=5000)
    for i in range(3):
        drop(drops, f"part-{i}.arrows", rows(40_000, i * 100_000), batch=4_000)
    manifest = data / "sources" / "drops" / "manifest.json"

    def committed() -> int:
        try:
            return sum(e["committed"] for e in json.loads(manifest.read_text())["files"])
        except (FileNotFoundError, ValueError):
            return 0

    log = tmp_path / "gateway.log"
    kill_at(lambda: start_stream(config, log), committed, (20_000, 70_000), 120_000)
    run_until(lambda: start_stream(config, log), lambda: committed() == 120_000, "all rows")
    keys = raw_rows(data, topic)
    assert len(keys) == len(set(keys)) == 120_000
    decoded = pq.read_table(data / "decoded" / f"topic={topic}").combine_chunks()
    ids = pc.unique(decoded["id"]).to_pylist()
    assert len(ids) == decoded.num_rows == 120_000
