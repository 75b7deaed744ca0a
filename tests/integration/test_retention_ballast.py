"""Retention on a disk full to its last block: raising a floor means writing a small
file, which such a disk refuses, and nothing may be deleted before the floor rose. The
retention ballast (lane/upkeep/ballast.py) is given up to let the floor be written, the old
segments go, and the ballast is laid again at once.

A real full disk: a small tmpfs (the kernel answers ENOSPC) filled to the last byte.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import SmallDisk
from tests.unit.lane.test_retention import T, lane
from thalweg.config.load import parse_config
from thalweg.engine.jobs.retention import RetentionJob
from thalweg.lane.layout import Lane, LaneLayout
from thalweg.lane.upkeep.ballast import BALLAST_BYTES
from thalweg.lane.upkeep.retention import raise_floor
from thalweg.ops.metrics import Metrics

pytestmark = pytest.mark.integration


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    d = SmallDisk(tmp_path / "disk", 512)
    yield d
    d.close()


def fill(root: Path) -> None:
    """Write until the disk refuses a single byte more."""
    n = 0
    for size in (64 * 1024, 4096, 1):
        while True:
            try:
                with open(root / f"filler-{n}", "wb") as f:
                    f.write(bytes(size))
                n += 1
            except OSError as exc:
                (root / f"filler-{n}").unlink(missing_ok=True)
                if exc.errno != errno.ENOSPC:
                    raise
                break


def job(data: Path) -> RetentionJob:
    cfg = parse_config(
        {
            "gateway": {"data_dir": str(data)},
            "sources": [{"kind": "kafka", "name": "s", "bootstrap_servers": "127.0.0.1:9",
                         "topics": [T]}],
            "retention": {"max_age_s": 60, "grace_s": 0},
        }
    )  # fmt: skip
    return RetentionJob(cfg, LaneLayout(data), Metrics())


def test_the_ballast_lets_retention_raise_a_floor_on_a_full_disk(disk: SmallDisk) -> None:
    data = disk.path / "data"
    layout = lane(data)  # five segments in every lane, hours old
    retention = job(data)
    assert retention.ballast.lay()
    assert retention.ballast.path.stat().st_size == BALLAST_BYTES
    fill(disk.path)
    with pytest.raises(
        OSError, match="No space left on device"
    ) as refused:  # without the ballast: stuck
        raise_floor(layout, T, 0, 100, now=1e6)
    assert refused.value.errno == errno.ENOSPC
    retention.run_once(now=1e6)
    assert [s.first for s in layout.segments(Lane.RAW, T, 0)] == [400]  # all but the newest
    assert sorted(p.name for p in layout.partition_dir(Lane.RAW, T, 0).iterdir()) == [
        "00000000000000000400-00000000000000000499.parquet"
    ]
    assert retention.ballast.laid  # laid again at once, from the room the files left


def test_without_a_ballast_on_a_full_disk_the_run_fails_and_deletes_nothing(
    disk: SmallDisk,
) -> None:
    data = disk.path / "data"
    layout = lane(data)
    retention = job(data)
    fill(disk.path)  # before the ballast was ever laid
    with pytest.raises(OSError, match="No space left on device") as refused:
        retention.run_once(now=1e6)
    assert refused.value.errno == errno.ENOSPC
    assert len(list(layout.partition_dir(Lane.RAW, T, 0).iterdir())) == 5  # nothing lost
    assert layout.floor(T, 0) == 0
