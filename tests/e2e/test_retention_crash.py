"""Retention under SIGKILL: ``twg stream`` killed again and again while records arrive
and retention raises each partition's floor and sweeps the files below it.

A kill can land between the two steps (the floor written durably; the files below it
deleted ``grace_s`` later) or inside a sweep, between one lane's deletions and the next.
The floor and its pending steps are on disk, so the next start sweeps what is due and
removes any twin left without its raw segment. At the end each partition's lanes hold
exactly the positions from its floor to its end, once, in the raw and decoded lanes
alike, counting every file on disk; the floor never rose past a position not yet
durable, and no temp file is left.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.e2e.upkeep import (
    PARTITIONS,
    TOTAL,
    config_text,
    kill_repeatedly,
    lane_files,
    produce,
    ranges,
    run_until_settled,
    temp_files,
)
from tests.helpers import assert_verified, committed_offsets, seeded_rng
from thalweg.embedded import TansuBroker
from thalweg.lane import LaneLayout, scan_coverage

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# 100-row segments of ~25 KB, at most 150 KB per partition, swept 2 s after the floor
# rises: a kill finds floors raised and files not yet deleted.
RETENTION = """
[retention]
max_bytes = 150000
grace_s = 2.0
interval_s = 0.2
"""


def test_retention_killed_mid_sweep_keeps_exactly_the_floor_to_the_end(
    broker: TansuBroker, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(PARTITIONS, prefix="retain")
    group = f"retain-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "lane"
    config = tmp_path / "twg.toml"
    log = tmp_path / "gateway.log"
    config.write_text(config_text(broker.bootstrap, topic, group, data, RETENTION))
    layout = LaneLayout(data)
    produced = produce(broker.bootstrap, topic, pad=200)
    expected = {q: len(range(q, TOTAL, PARTITIONS)) for q in range(PARTITIONS)}

    def raw_dir(q: int) -> Path:
        return data / "raw" / f"topic={topic}" / f"partition={q}"

    def floor(q: int) -> int:
        return layout.floor(topic, q)

    def below_floor(q: int) -> int:
        """Raw files wholly below the floor: raised, not swept yet."""
        return sum(last < floor(q) for _, last in ranges(raw_dir(q)))

    def ends() -> dict[int, int]:
        return {q: scan_coverage(layout, topic, q).end or 0 for q in range(PARTITIONS)}

    def mid_sweep() -> bool:
        for q in range(PARTITIONS):  # and never a floor past what is durable
            assert floor(q) <= (scan_coverage(layout, topic, q).end or 0)
        return any(below_floor(q) for q in range(PARTITIONS))

    rng = seeded_rng("THALWEG_CRASH_SEED")  # printed: a failing run can be replayed
    kills = kill_repeatedly(config, log, rng, mid_sweep)
    print(f"{kills.mid_way} of {kills.total} kills left files below a raised floor")
    assert kills.mid_way >= 1, "no kill found a sweep pending"
    assert produced.wait(60), "the producer did not finish"

    def settled() -> bool:
        swept = not any(below_floor(q) for q in range(PARTITIONS))
        return ends() == expected and swept and min(map(floor, range(PARTITIONS))) > 0

    run_until_settled(config, log, settled, "ingest and sweeps to finish")

    assert temp_files(data) == []
    floors = {q: floor(q) for q in range(PARTITIONS)}
    raw = lane_files(data, "raw", topic, ["_twg_source_partition", "_twg_source_offset"])
    for q in range(PARTITIONS):
        offsets = raw.filter(pc.equal(raw["_twg_source_partition"], q))["_twg_source_offset"]
        assert sorted(offsets.to_pylist()) == list(range(floors[q], expected[q])), f"raw {q}"
    decoded = lane_files(data, "decoded", topic, ["n"])
    kept = [n for n in range(TOTAL) if n // PARTITIONS >= floors[n % PARTITIONS]]
    assert sorted(decoded["n"].to_pylist()) == kept  # the same rows, once: no lone twin
    assert committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS)) == expected
    assert_verified(config)
