"""Compaction under SIGKILL: ``twg stream`` killed again and again while it ingests many
small segments and merges them.

A kill can land between any two steps of a merge (dead letters, decoded, raw written;
the parts deleted ``grace_s`` later). Whatever it leaves, the next start-up repairs: a
merge without its raw file is debris, parts inside a merged file are deleted. At the
end every offset is in the raw lane once and every record in the decoded lane once,
counting every file on disk (not only what a listing shows), and no temp file is left.
"""

from __future__ import annotations

import time
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
    nested,
    produce,
    ranges,
    run_until_settled,
    temp_files,
)
from tests.helpers import assert_verified, committed_offsets, seeded_rng
from thalweg.config.retention import CompactionConfig
from thalweg.embedded import TansuBroker
from thalweg.lane import LaneLayout, scan_coverage
from thalweg.lane.upkeep.compaction import plan_runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Merged as soon as four segments are closed, the parts deleted 2 s later: a kill finds
# merges in every state.
COMPACTION = """
[compaction]
enabled = true
min_files = 4
min_age_s = 0
grace_s = 2.0
interval_s = 0.2
"""


def test_compaction_killed_mid_merge_loses_and_repeats_nothing(
    broker: TansuBroker, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(PARTITIONS, prefix="compact")
    group = f"compact-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "lane"
    config = tmp_path / "twg.toml"
    log = tmp_path / "gateway.log"
    config.write_text(config_text(broker.bootstrap, topic, group, data, COMPACTION))
    layout = LaneLayout(data)
    produced = produce(broker.bootstrap, topic, pad=0)
    expected = {q: len(range(q, TOTAL, PARTITIONS)) for q in range(PARTITIONS)}

    def raw_dir(q: int) -> Path:
        return data / "raw" / f"topic={topic}" / f"partition={q}"

    def ends() -> dict[int, int]:
        return {q: scan_coverage(layout, topic, q).end or 0 for q in range(PARTITIONS)}

    def mid_merge() -> bool:
        """A merge's parts beside it, or a merge's temp files."""
        return any(nested(ranges(raw_dir(q))) for q in range(PARTITIONS)) or bool(temp_files(data))

    rng = seeded_rng("THALWEG_CRASH_SEED")  # printed: a failing run can be replayed
    kills = kill_repeatedly(config, log, rng, mid_merge)
    print(f"{kills.mid_way} of {kills.total} kills left a merge in progress")
    assert kills.mid_way >= 1, "no kill found a merge in progress"
    assert produced.wait(60), "the producer did not finish"

    due = CompactionConfig(enabled=True, min_files=4, min_age_s=0)

    def settled() -> bool:
        """Everything ingested, merged and swept — and no merge due: one found due (or
        running) while this held would land during the stop, and its parts, inside
        their grace period, would stay beside it (a CI run counted 7,900 offsets twice
        so: the product's listing hides such parts, and the next start deletes them)."""
        spans = [ranges(raw_dir(q)) for q in range(PARTITIONS)]
        merged = all(len(s) <= 8 for s in spans)
        quiet = not any(plan_runs(layout, topic, q, due, time.time()) for q in range(PARTITIONS))
        return ends() == expected and merged and not any(nested(s) for s in spans) and quiet

    run_until_settled(config, log, settled, "ingest and merges to finish, parts deleted")

    assert temp_files(data) == []
    left = {q: nested(ranges(raw_dir(q))) for q in range(PARTITIONS)}
    assert not any(left.values()), f"a merge landed while stopping; parts beside it: {left}"
    raw = lane_files(data, "raw", topic, ["_twg_source_partition", "_twg_source_offset"])
    for q in range(PARTITIONS):
        offsets = raw.filter(pc.equal(raw["_twg_source_partition"], q))["_twg_source_offset"]
        assert sorted(offsets.to_pylist()) == list(range(expected[q])), f"raw partition {q}"
    decoded = lane_files(data, "decoded", topic, ["n"])
    assert sorted(decoded["n"].to_pylist()) == list(range(TOTAL))  # every record once
    merged = [s for q in range(PARTITIONS) for s in ranges(raw_dir(q)) if s[1] - s[0] >= 100]
    assert merged, "nothing was merged"
    assert committed_offsets(broker.bootstrap, group, topic, range(PARTITIONS)) == expected
    assert_verified(config)
