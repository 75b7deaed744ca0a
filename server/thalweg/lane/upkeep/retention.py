"""Retention: a partition's oldest segments go, by age or by size, and nothing breaks.

A partition's lanes are removed together, oldest segment first — a raw segment with its
decoded and dead-letter twins (they share its name, and a twin without its raw segment
is removed as debris at start), the node lanes' files and the nodes' dead letters below
it — and never the newest raw segment (resume and the log-continuity check read it).

Removal is two steps, so a reader never loses a file under it:

1. **The floor rises** (``data_dir/retention/topic=<t>/<p>.json``, written durably): the
   first position kept. ``LaneLayout.segments`` hides every segment below it at once, so
   the lane's coverage, reads planned from now on, ``describe``'s ``earliest`` and the
   sinks' work all start there; a read that names an offset below it gets an error
   naming the earliest position available.
2. **The files go** ``grace_s`` after the floor rose — a read planned before still has
   them. Each rise is kept with its time until its files are gone.

With ``wait_for_sinks`` (the default) the floor never passes a position some sink or
node lane has not landed: a sink that lags holds retention back, and says so, rather
than lose records it has not written.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from thalweg.config.retention import RetentionConfig
from thalweg.lane.durable import ensure_dir, fsync_dir, write_json_durably
from thalweg.lane.layout import _SEGMENT_RE, Lane, LaneLayout, Segment
from thalweg.lane.read.ipc_copies import remove_copy

log = logging.getLogger(__name__)


#: A merged file's footer: when its newest and its oldest part were made durable, for
#: its age and its span — the file's own time is when the merge wrote it.
META_NEWEST_AT = b"thalweg.newest_at"
META_OLDEST_AT = b"thalweg.oldest_at"

_locks: dict[tuple[str, str, int], threading.Lock] = {}
_locks_guard = threading.Lock()


def upkeep_lock(layout: LaneLayout, topic: str, partition: int) -> threading.Lock:
    """One upkeep step of a partition at a time in this process (only its owner keeps
    it): a floor never rises while a merge of the partition is written. A merge planned
    before a floor rose would otherwise publish, across the floor, records retention
    removed (an outside check found ``36120-37319`` written after "removed 38 files
    below 36720": ``earliest`` went back, and removed records were served again)."""
    key = (str(layout.root), topic, partition)
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def newest_at(segment: Segment) -> float:
    """When a segment's newest record was made durable: a merged file's footer says
    (the newest of its parts'); any other segment's file time is when it was written."""
    return _durable_at(segment, META_NEWEST_AT)


def oldest_at(segment: Segment) -> float:
    """When a segment's oldest part was made durable (a plain segment: when it was)."""
    return _durable_at(segment, META_OLDEST_AT)


def _durable_at(segment: Segment, key: bytes) -> float:
    try:
        meta = pq.read_schema(segment.path).metadata or {}
    except (OSError, pa.ArrowException):
        meta = {}
    found = meta.get(key)
    return float(found) if found is not None else segment.path.stat().st_mtime


@dataclass(frozen=True, slots=True)
class Decision:
    """What retention would do to one partition now."""

    floor: int | None  # the new floor, when it rises
    held_by: str | None = None  # why it rose less than the bounds ask


def lane_bytes(layout: LaneLayout, topic: str, partition: int, seg: Segment) -> int:
    """A raw segment's bytes on disk with its twins."""
    total = 0
    for lane in Lane:
        path = layout.partition_dir(lane, topic, partition) / seg.path.name
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            continue
    return total


def decide(
    layout: LaneLayout,
    topic: str,
    partition: int,
    cfg: RetentionConfig,
    *,
    now: float,
    keep_from: int | None = None,
    held_by: str = "",
) -> Decision:
    """The floor the bounds ask for, oldest segment first, never past the newest
    segment nor past ``keep_from`` (the first position a sink has not landed)."""
    segments = layout.segments(Lane.RAW, topic, partition)
    if len(segments) < 2:
        return Decision(None)
    sizes = [lane_bytes(layout, topic, partition, s) for s in segments]
    total = sum(sizes)
    floor: int | None = None
    for seg, size in zip(segments[:-1], sizes[:-1], strict=True):
        # The age of its newest record, not of the file: a merged file is written long
        # after its records arrived (with the file's time, compaction kept every floor
        # down: a merge absorbing new segments was always young).
        too_old = cfg.max_age_s is not None and now - newest_at(seg) > cfg.max_age_s
        too_big = cfg.max_bytes is not None and total > cfg.max_bytes
        if not (too_old or too_big):
            break
        if keep_from is not None and seg.last + 1 > keep_from:
            return Decision(floor, f"{held_by} has not landed {topic}[{partition}]@{keep_from}")
        floor = seg.last + 1
        total -= size
    return Decision(floor)


def raise_floor(layout: LaneLayout, topic: str, partition: int, floor: int, now: float) -> None:
    """Make ``floor`` the partition's first position, durably; the files below it are
    deleted by :func:`sweep` once ``grace_s`` passed."""
    path = layout.floor_path(topic, partition)
    body = _read(path)
    if floor <= int(body.get("floor", 0)):
        return
    steps = [*body.get("steps", []), [floor, now]]
    ensure_dir(path.parent)
    write_json_durably(path, {"floor": floor, "steps": steps})


def sweep(
    layout: LaneLayout, topic: str, partition: int, grace_s: float, now: float | None = None
) -> tuple[int, int]:
    """Delete the files below each floor that rose at least ``grace_s`` ago; (files,
    bytes) removed."""
    now = time.time() if now is None else now
    path = layout.floor_path(topic, partition)
    body = _read(path)
    steps = body.get("steps", [])
    due = [f for f, at in steps if at + grace_s <= now]
    if not due:
        return 0, 0
    below = max(due)
    files = nbytes = 0
    for lane in Lane:
        directory = layout.partition_dir(lane, topic, partition)
        before = files
        for name in _names(directory):
            m = _SEGMENT_RE.match(name)
            if m and int(m[2]) < below:
                files, nbytes = _unlink(directory / name, files, nbytes)
                if lane is Lane.DECODED:
                    remove_copy(layout.root, directory / name)
        if files > before:
            fsync_dir(directory)
    for node in layout.nodes():
        for _epoch, _start, end, lane_file in layout.node_files(node, topic, partition):
            if end <= below:
                files, nbytes = _unlink(lane_file, files, nbytes)
        dead = layout.node_dead_letter_dir(node, topic, partition)
        for name in _names(dead):
            m = _SEGMENT_RE.match(name)
            if m and int(m[2]) < below:
                files, nbytes = _unlink(dead / name, files, nbytes)
    for sink in layout.refusing_sinks():  # what sinks' destinations refused goes too
        dead = layout.refused_dir(sink, topic, partition)
        for name in _names(dead):
            m = _SEGMENT_RE.match(name)
            if m and int(m[2]) < below:
                files, nbytes = _unlink(dead / name, files, nbytes)
    left = [[f, at] for f, at in steps if f > below]
    write_json_durably(path, {"floor": body["floor"], "steps": left})
    if files:
        log.info("retention: %s[%d] removed %d files below %d", topic, partition, files, below)
    return files, nbytes


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _unlink(path: Path, files: int, nbytes: int) -> tuple[int, int]:
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return files, nbytes
    return files + 1, nbytes + size


def _read(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return body if isinstance(body, dict) else {}
