"""A decoded twin whose write failed is rebuilt while the gateway runs, not only at its
next start: the raw segment is durable and committed without it (the raw lane never
waits on the decoded one), then its raw file is decoded again, retried until it lands.

The refusal is injected into the writer of a real gateway on tansu (the first decoded
writes raise ENOSPC); tests/e2e/test_full_disk.py fills a real disk.
"""

from __future__ import annotations

import errno
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import RunningGateway, TansuBroker
from tests.helpers import produce_json, wait_until
from thalweg.lane.writer import SegmentWriter

pytestmark = pytest.mark.integration


def test_a_decoded_twin_the_disk_refused_is_rebuilt_while_running(
    broker: TansuBroker,
    topic_factory: Callable[..., str],
    gateway_factory: Callable[..., RunningGateway],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refused: list[Path] = []
    prepare = SegmentWriter._prepare

    def full_for_decoded(
        self: SegmentWriter, table: pa.Table, path: Path, *a: Any, **k: Any
    ) -> Path:
        # The first decoded write and the first two rebuilds of that same segment:
        # whatever else is written meanwhile, the rebuild is refused and retried.
        decoded = "decoded" in path.parts[-4]
        if decoded and len(refused) < 3 and (not refused or path.name == refused[0].name):
            refused.append(path)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return prepare(self, table, path, *a, **k)

    monkeypatch.setattr(SegmentWriter, "_prepare", full_for_decoded)
    topic = topic_factory(1)
    gw = gateway_factory([topic], raw_lane={"roll_rows": 200}, max_poll_records=200)
    total = produce_json(broker.bootstrap, topic, ({"n": i} for i in range(1000)))
    gw.wait_durable(topic, {0: total})
    assert refused, "no decoded write was refused"
    raw_dir = gw.data_dir / "raw" / f"topic={topic}" / "partition=0"
    decoded_dir = gw.data_dir / "decoded" / f"topic={topic}" / "partition=0"

    def missing() -> list[str]:
        have = {f.name for f in decoded_dir.glob("*.parquet")}
        return [f.name for f in raw_dir.glob("*.parquet") if f.name not in have]

    wait_until(lambda: missing() == [], 30, lambda: f"the twins rebuilt: {missing()} missing")
    decoded = pa.concat_tables(
        pq.read_table(f, columns=["n"]) for f in decoded_dir.glob("*.parquet")
    )
    assert sorted(decoded.column("n").to_pylist()) == list(range(total))
    metrics = urllib.request.urlopen(f"{gw.admin_url}/metrics").read().decode()
    assert 'twg_retries_total{stage="decoded_rebuild"}' in metrics  # refused again, retried
    assert gw.gateway.health.ready()  # never blocked: the raw lane was written throughout
