"""The Grafana dashboard queries only metrics the gateway exports (names cannot drift)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from thalweg.ops.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "thalweg-dashboard.json"


def test_every_dashboard_metric_is_exported() -> None:
    exported = set()
    for family in Metrics().registry.collect():
        exported.add(family.name)
        exported.update(s.name for s in family.samples)
        if family.type == "counter":
            exported.add(family.name + "_total")
        if family.type == "histogram":
            exported.update(family.name + s for s in ("_bucket", "_sum", "_count"))
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\btwg_[a-z_]+", e)}
    assert len(used) >= 15
    assert used <= exported, sorted(used - exported)
