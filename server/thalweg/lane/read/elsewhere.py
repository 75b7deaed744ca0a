"""Position ranges of a partition that this ``data_dir`` will never hold.

With a ``data_dir`` per replica, a partition that moves between gateways leaves its
history split: the old owner's lane ends where the group's commit was, and the new
owner's lane starts there. The new owner knows the moment it happens — it resumes at a
committed offset beyond anything its lane holds — and records the range it skipped
here, durably, before it writes anything. A read that asks for any of it is refused
with where the lane resumes (``flight.read.plan``), never answered with a silently
partial result. A shared ``data_dir`` never has such a range: the previous owner's
segments are in it.

``data_dir/elsewhere/topic=<t>/<p>.json``: ``{"ranges": [[first, end), ...]}``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from urllib.parse import quote

from thalweg.errors import LaneError
from thalweg.lane.durable import write_file_durably
from thalweg.lane.layout import LaneLayout

ELSEWHERE_DIR = "elsewhere"

_cache: dict[Path, tuple[int, list[tuple[int, int]]]] = {}
_lock = threading.Lock()


def elsewhere_path(layout: LaneLayout, topic: str, partition: int) -> Path:
    return layout.root / ELSEWHERE_DIR / f"topic={quote(topic, safe='')}" / f"{partition}.json"


def held_elsewhere(layout: LaneLayout, topic: str, partition: int) -> list[tuple[int, int]]:
    """The ``[first, end)`` ranges this lane skipped, oldest first (cached by mtime)."""
    path = elsewhere_path(layout, topic, partition)
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return []
    with _lock:
        cached = _cache.get(path)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        ranges = [(int(lo), int(hi)) for lo, hi in body["ranges"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LaneError(f"{path}: unreadable record of ranges held elsewhere: {exc}") from exc
    with _lock:
        _cache[path] = (mtime, ranges)
    return ranges


def record_elsewhere(layout: LaneLayout, topic: str, partition: int, first: int, end: int) -> None:
    """Note durably that ``[first, end)`` of the partition is not in this lane."""
    if end <= first:
        return
    ranges = held_elsewhere(layout, topic, partition)
    if any(lo <= first and end <= hi for lo, hi in ranges):
        return
    ranges = sorted([*ranges, (first, end)])
    data = json.dumps({"ranges": [list(r) for r in ranges]}).encode()

    def write(tmp: Path) -> None:
        tmp.write_bytes(data)

    write_file_durably(elsewhere_path(layout, topic, partition), write)


def first_gap(
    layout: LaneLayout, topic: str, partition: int, start: int, end: int | None
) -> tuple[int, int] | None:
    """The first skipped range that ``[start, end)`` (``end`` None: open) touches."""
    for lo, hi in held_elsewhere(layout, topic, partition):
        if hi > start and (end is None or lo < end):
            return lo, hi
    return None
