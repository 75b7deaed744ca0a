"""Which source positions the raw lane holds, and where a partition resumes.

Coverage is a set of half-open ranges ``[from, to)`` of source positions, not a count
of records: a compacted topic or a transaction marker leaves offsets with no record, and
the segment that follows accounts for them (its ``covers_from`` footer key). So
"contiguous" means "no position unaccounted for", which is what resume needs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from thalweg.errors import SegmentConflictError
from thalweg.lane.durable import TMP_MARK, ensure_dir, fsync_dir, remove_interrupted_writes
from thalweg.lane.layout import (
    _SEGMENT_RE,
    META_COVERS_FROM,
    Lane,
    LaneLayout,
    Segment,
    segment_name,
)
from thalweg.lane.read.elsewhere import elsewhere_path
from thalweg.lane.read.ipc_copies import remove_copy
from thalweg.records.ranges import merge_ranges

QUARANTINE = "quarantine"

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Coverage:
    """Merged, sorted ``[from, to)`` ranges of one partition."""

    ranges: list[tuple[int, int]] = field(default_factory=list)

    def add(self, start: int, end: int) -> None:
        """Record ``[start, end)``; adjacent and overlapping ranges merge.

        Segments arrive in order, so the usual add extends or follows the last range
        without re-sorting everything (a lane's scan stays linear in its segments)."""
        if self.ranges:
            a, b = self.ranges[-1]
            if a <= start <= b:
                self.ranges[-1] = (a, max(b, end))
                return
            if start > b:
                self.ranges.append((start, end))
                return
        self.ranges = merge_ranges([*self.ranges, (start, end)])

    @property
    def end(self) -> int | None:
        """The end of the last range (None when empty)."""
        return self.ranges[-1][1] if self.ranges else None

    def end_of_run(self, position: int) -> int | None:
        """The end of the range that contains or ends at ``position``."""
        for a, b in self.ranges:
            if a <= position <= b:
                return b
        return None


META_COMPACTED = b"thalweg.compacted"


def is_compacted(segment: Segment) -> bool:
    """Whether a raw segment was written by compaction (merging smaller ones)."""
    try:
        meta = pq.read_schema(segment.path).metadata or {}
    except (OSError, pa.ArrowException):
        return False
    return meta.get(META_COMPACTED) == b"1"


def remove_merged(layout: LaneLayout, topic: str, partition: int, merged: list[Segment]) -> int:
    """Delete segments a compaction merged — their twins in every lane and the nodes'
    dead letters named after them; the files removed."""
    removed = 0
    names = {s.path.name for s in merged}
    # The raw part goes last: while it is on disk, start-up sees a part inside its merge
    # and removes the part's every file (``_resolve_overlaps``). Removed first, a crash
    # could leave a decoded part no listing shows (it lies inside the merged twin) whose
    # rows a read of the directory would count twice.
    dirs = [layout.partition_dir(lane, topic, partition) for lane in (Lane.DECODED, Lane.DLQ)]
    dirs += [layout.node_dead_letter_dir(n, topic, partition) for n in layout.nodes()]
    dirs.append(layout.partition_dir(Lane.RAW, topic, partition))
    decoded = layout.partition_dir(Lane.DECODED, topic, partition)
    for name in names:  # the Arrow IPC copies first: none outlives its segment
        remove_copy(layout.root, decoded / name)
    for directory in dirs:
        before = removed
        for name in names:
            try:
                (directory / name).unlink()
                removed += 1
            except FileNotFoundError:
                continue
        if removed > before:
            fsync_dir(directory)
    return removed


def covers_from(segment: Segment) -> int:
    """Where ``segment`` covers from: its footer's ``covers_from`` (skipped offsets
    before its first record are its too), else its first record."""
    meta = pq.read_schema(segment.path).metadata or {}
    raw = meta.get(META_COVERS_FROM)
    return int(raw) if raw is not None else segment.first


def scan_coverage(layout: LaneLayout, topic: str, partition: int) -> Coverage:
    """Coverage of a partition's raw lane, read from file names (and a footer only where
    two names are not adjacent, to learn whether the gap is skipped offsets)."""
    cov = Coverage()
    prev_end: int | None = None
    for seg in layout.segments(Lane.RAW, topic, partition):
        start = seg.first
        if prev_end is not None and seg.first != prev_end:
            start = min(seg.first, covers_from(seg))
        cov.add(start, seg.last + 1)
        prev_end = seg.last + 1
    return cov


def resume_position(cov: Coverage, committed: int | None) -> int | None:
    """Where to fetch from so no durable record is written twice and none is skipped.

    The committed offset may lag the lane (a crash between rename and commit); then the
    lane wins. It never leads it in a healthy lane; if it does (the lane was deleted),
    the committed offset wins and the lane restarts there.
    """
    if committed is None:
        return cov.end
    run_end = cov.end_of_run(committed)
    return committed if run_end is None else max(run_end, committed)


def repair(layout: LaneLayout, topic: str, partition: int) -> list[Segment]:
    """Make a partition's lanes consistent after a crash.

    Removes temp files of interrupted writes (the lanes', the nodes' dead letters', the
    retention floor's, the held-elsewhere marker's), and decoded and dead-letter segments without
    a raw twin (written just before a crash; the records will be fetched again). A raw
    segment whose offsets lie inside another's (two writers of one lane, before fencing
    existed) moves with its twins to ``quarantine/``.

    Raises:
        SegmentConflictError: two raw segments overlap without one containing the other;
            which of them is right cannot be told from the lane, so nothing is guessed.

    Returns:
        Raw segments that have no decoded twin and need decoding again.
    """
    dirs = [layout.partition_dir(lane, topic, partition) for lane in Lane]
    dirs += [layout.node_dead_letter_dir(node, topic, partition) for node in layout.nodes()]
    for directory in dirs:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            continue
        for name in names:
            if TMP_MARK in name:
                (directory / name).unlink(missing_ok=True)
                log.info("removed interrupted write %s", directory / name)
    remove_interrupted_writes(layout.floor_path(topic, partition))
    remove_interrupted_writes(elsewhere_path(layout, topic, partition))
    _resolve_overlaps(layout, topic, partition)
    raw = {s.path.name: s for s in layout.segments(Lane.RAW, topic, partition)}
    decoded: set[str] = set()
    for lane in (Lane.DECODED, Lane.DLQ):
        # Every file, contained ones too: a twin inside another (a merge's part whose raw
        # file is gone) is listed by nothing else and would never be removed.
        for seg in layout.segments(lane, topic, partition, contained=True):
            if seg.path.name not in raw:
                seg.path.unlink(missing_ok=True)
                log.info("removed %s segment without raw twin %s", lane.value, seg.path)
            elif lane is Lane.DECODED:
                decoded.add(seg.path.name)
    _remove_unlanded_node_merges(layout, topic, partition)
    return [raw[name] for name in sorted(raw.keys() - decoded)]


def _remove_unlanded_node_merges(layout: LaneLayout, topic: str, partition: int) -> None:
    """Remove nodes' dead-letter files a compaction wrote for a merge whose raw file
    never landed (a crash between the two): named for a range that spans raw segments
    but is none itself. Their rows are still in the parts' own files."""
    spans = [
        (s.first, s.last)
        for s in layout.segments(Lane.RAW, topic, partition, retained=False, contained=True)
    ]
    names = {segment_name(a, b) for a, b in spans}
    for node in layout.nodes():
        directory = layout.node_dead_letter_dir(node, topic, partition)
        try:
            found = os.listdir(directory)
        except FileNotFoundError:
            continue
        for name in found:
            m = _SEGMENT_RE.match(name)
            if m is None or name in names:
                continue
            first, last = int(m[1]), int(m[2])
            if any(first <= a and b <= last and (a, b) != (first, last) for a, b in spans):
                (directory / name).unlink(missing_ok=True)
                log.info("removed a node's dead letters of an unlanded merge %s", directory / name)


def _resolve_overlaps(layout: LaneLayout, topic: str, partition: int) -> None:
    """Quarantine raw segments contained in another — or delete them, when the other is
    the compaction that merged them (``lane.compaction``); refuse partial overlaps."""
    segments = layout.segments(Lane.RAW, topic, partition, retained=False, contained=True)
    # Widest first among equal starts, so a contained segment follows its container.
    segments.sort(key=lambda s: (s.first, -s.last))
    keeper: Segment | None = None
    for seg in segments:
        if keeper is None or seg.first > keeper.last:
            keeper = seg
            continue
        if seg.last <= keeper.last:
            if is_compacted(keeper):
                remove_merged(layout, topic, partition, [seg])
            else:
                _quarantine(layout, topic, partition, seg, keeper)
            continue
        raise SegmentConflictError(
            f"{topic}[{partition}]: raw segments {keeper.path.name} and {seg.path.name} "
            "overlap without one containing the other; the lane is refused until an "
            f"operator removes one (see docs/operations.md). Directory: {seg.path.parent}"
        )


def _quarantine(
    layout: LaneLayout, topic: str, partition: int, seg: Segment, keeper: Segment
) -> None:
    for lane in Lane:
        src = layout.partition_dir(lane, topic, partition) / seg.path.name
        if not src.exists():
            continue
        dst_dir = layout.root / QUARANTINE / lane.value / src.parent.parent.name / src.parent.name
        ensure_dir(dst_dir)
        os.rename(src, dst_dir / src.name)
        fsync_dir(dst_dir)
        fsync_dir(src.parent)
    log.warning(
        "%s[%d]: raw segment %s lies inside %s (two writers of one lane); moved to %s",
        topic,
        partition,
        seg.path.name,
        keeper.path.name,
        layout.root / QUARANTINE,
    )
