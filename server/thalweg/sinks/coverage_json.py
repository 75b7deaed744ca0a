"""A destination's record of coverage as text: per topic, partition and epoch the ranges
of positions, as JSON (``{"orders": {"0:0": [[0, 500]]}}``) — what the Iceberg sink
keeps in a snapshot summary and the Delta sink in a commit's metadata."""

from __future__ import annotations

import json

from thalweg.sinks.base import Ranges

# A destination's key for a sink's coverage: ``thalweg.coverage.<sink>`` (ADR 0022).
COVERAGE_PREFIX = "thalweg.coverage."


def encode_coverage(ranges: Ranges) -> str:
    body: dict[str, dict[str, list[tuple[int, int]]]] = {}
    for (t, p, e), rs in sorted(ranges.items()):
        body.setdefault(t, {})[f"{p}:{e}"] = rs
    return json.dumps(body, separators=(",", ":"))


def decode_coverage(text: str) -> Ranges:
    out: Ranges = {}
    for topic, parts in json.loads(text).items():
        for key, rs in parts.items():
            p, _, e = key.partition(":")
            out[(topic, int(p), int(e))] = [(int(a), int(b)) for a, b in rs]
    return out
