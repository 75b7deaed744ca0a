"""The lanes of one partition audited from the files on disk, read-only.

What a reader sees is the listing (``LaneLayout.segments``: at or above the retention
floor, the outermost file where one lies inside another); what is on disk is every file.
Both are checked:

* the listed raw files hold every position of the lane's coverage once — no overlap, no
  position twice, no gap other than offsets the lane skipped on purpose (another
  replica's, ``lane.elsewhere``) — and each file's rows are the positions its name says;
* a file the listing hides is a merge's part awaiting its sweep, or below the floor
  awaiting retention's (warnings: normal for a moment), or a raw file inside one that is
  not a merge — two writers of one lane (an error);
* each listed raw file's decoded twin holds exactly its positions, and the dead-letter
  file exactly the twin's failed rows; a decoded or dead-letter file with no raw file
  of its name on disk is an orphan (its rows counted by anyone reading the directory);
* temp files are interrupted writes (start-up removes them).

The positions a sink should hold come out of it too: the twin's rows that decoded (the
raw rows for a raw sink).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from thalweg.lane.coverage import covers_from, is_compacted, scan_coverage
from thalweg.lane.durable import TMP_MARK
from thalweg.lane.epochs import current_epoch
from thalweg.lane.layout import Lane, LaneLayout, Segment
from thalweg.lane.origin import read_origin
from thalweg.lane.read.elsewhere import held_elsewhere
from thalweg.records.columns import MetadataColumns
from thalweg.records.ranges import merge_ranges, subtract_ranges
from thalweg.verify.report import Report

#: A hidden file older than this is worth a warning (a merge's grace period, a sweep).
SETTLE_S = 60.0


@dataclass(slots=True)
class LaneAudit:
    """One partition's lane: coverage, and the positions each kind of sink should hold."""

    topic: str
    partition: int
    epoch: int
    floor: int
    coverage: list[tuple[int, int]]
    rows: int
    raw_positions: np.ndarray  # every listed raw row, ascending
    decoded_positions: np.ndarray  # the rows a decoded sink receives (decoded, no error)
    decoded: bool  # the topic has a decoded lane
    elsewhere: list[tuple[int, int]] = field(default_factory=list)
    # Ranges whose decoded twin is missing: which of their records decoded is unknown
    # until it is rebuilt, so a decoded sink is not checked there.
    undecided: list[tuple[int, int]] = field(default_factory=list)
    # Where the lane began (lane/origin.py); None: no record (an older lane, a bucket's).
    origin: int | None = None


def audit_partition(
    layout: LaneLayout,
    columns: MetadataColumns,
    topic: str,
    partition: int,
    report: Report,
    *,
    now: float | None = None,
    stopped: bool = False,
) -> LaneAudit:
    """Check one partition's lanes on disk; findings go to ``report``.

    ``stopped``: no process writes the lane now (lane/liveness.py), so what only a
    running writer finishes — an interrupted write's temp file — is a fault, not a moment.
    """
    now = time.time() if now is None else now
    where = f"{topic}[{partition}]"
    floor = layout.floor(topic, partition)
    listed = layout.segments(Lane.RAW, topic, partition)
    on_disk = layout.segments(Lane.RAW, topic, partition, retained=False, contained=True)
    _temp_files(layout, topic, partition, report, where, now, stopped)
    _hidden(listed, on_disk, floor, report, where, now)
    raw_positions = _raw_positions(listed, columns.position, report, where)
    decoded = layout.has_decoded(topic)
    undecided: list[tuple[int, int]] = []
    decoded_positions = (
        _twins(layout, columns, topic, partition, listed, report, where, undecided)
        if decoded
        else raw_positions
    )
    _orphans(layout, topic, partition, report, where, now)
    coverage = _from_first(scan_coverage(layout, topic, partition).ranges, listed)
    elsewhere = held_elsewhere(layout, topic, partition)
    for a, b in _gaps(coverage, elsewhere):
        report.add(
            "error",
            "gap",
            where,
            f"positions {a}-{b - 1} are in no raw segment (and not skipped on purpose)",
        )
    origin = read_origin(layout, topic, partition)
    if floor or origin is not None:
        why = (
            f"its origin record says {origin}"
            if origin is not None and origin >= floor
            else f"the retention floor is {floor}"
        )
        start_missing(coverage, max(floor, origin or 0), why, elsewhere, report, where)
    return LaneAudit(
        topic,
        partition,
        current_epoch(layout, topic, partition),
        floor,
        coverage,
        len(raw_positions),
        raw_positions,
        decoded_positions,
        decoded,
        elsewhere,
        undecided,
        origin,
    )


def start_missing(
    coverage: list[tuple[int, int]],
    expected: int,
    why: str,
    elsewhere: list[tuple[int, int]],
    report: Report,
    where: str,
) -> bool:
    """An error when the lane's first segment starts above where the lane should
    (``expected``, for the reason ``why``), less what is held elsewhere on purpose: the
    lane's first segments are lost, and nothing else in it says so. True if named."""
    if not coverage or coverage[0][0] <= expected:
        return False
    start = coverage[0][0]
    missing = subtract_ranges([(expected, start)], elsewhere)
    for a, b in missing:
        report.add(
            "error",
            "start_missing",
            where,
            f"positions {a}-{b - 1} are in no raw segment: the lane should start at "
            f"{expected} ({why}) and its first segment covers from {start} (the first "
            "segments were removed or never landed)",
        )
    return bool(missing)


def _gaps(
    coverage: list[tuple[int, int]], elsewhere: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Holes between the lane's covered ranges, less the ranges held elsewhere."""
    holes = [(b, c) for (_, b), (c, _) in pairwise(coverage) if c > b]
    return subtract_ranges(holes, elsewhere) if holes else []


def _temp_files(
    layout: LaneLayout,
    topic: str,
    partition: int,
    report: Report,
    where: str,
    now: float,
    stopped: bool,
) -> None:
    for lane in Lane:
        directory = layout.partition_dir(lane, topic, partition)
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        for e in entries:
            if TMP_MARK in e.name and now - e.stat().st_mtime > SETTLE_S:
                report.add(
                    "error" if stopped else "warning",
                    "temp_file",
                    where,
                    f"{lane.value}/{e.name}: an interrupted write "
                    f"({now - e.stat().st_mtime:.0f} s old"
                    + (
                        ", and no gateway is running: the next start removes it)"
                        if stopped
                        else "; start-up removes it)"
                    ),
                )


def _hidden(
    listed: list[Segment],
    on_disk: list[Segment],
    floor: int,
    report: Report,
    where: str,
    now: float,
) -> None:
    """Raw files on disk that the listing leaves out: what each is, and whether that is
    normal."""
    shown = {s.path.name for s in listed}
    for seg in on_disk:
        if seg.path.name in shown:
            continue
        age = now - seg.path.stat().st_mtime
        if floor and seg.last < floor:
            if age > SETTLE_S:
                report.add(
                    "warning",
                    "below_floor",
                    where,
                    f"raw/{seg.path.name} lies below the retention floor {floor} and is "
                    f"still on disk ({age:.0f} s old)",
                )
            continue
        container = next((s for s in listed if s.first <= seg.first and seg.last <= s.last), None)
        if container is None:
            continue  # inside a file below the floor: retention's
        if is_compacted(container):
            if age > SETTLE_S:
                report.add(
                    "warning",
                    "unswept_part",
                    where,
                    f"raw/{seg.path.name} is a part of the merge {container.path.name}, "
                    f"still on disk ({age:.0f} s old; the sweep or start-up removes it)",
                )
        else:
            report.add(
                "error",
                "contained",
                where,
                f"raw/{seg.path.name} lies inside {container.path.name}, which is not a "
                "merge: two writers of one lane (start-up repair quarantines one)",
            )


def _raw_positions(listed: list[Segment], position: str, report: Report, where: str) -> np.ndarray:
    """Every listed raw file's positions: each file as its name says, no file over
    another, no position twice."""
    parts = []
    for prev, seg in zip([None, *listed], listed, strict=False):
        if prev is not None and seg.first <= prev.last:
            report.add(
                "error",
                "overlap",
                where,
                f"raw/{seg.path.name} overlaps raw/{prev.path.name}: positions "
                f"{seg.first}-{min(seg.last, prev.last)} are served twice",
            )
        pos = pq.read_table(seg.path, columns=[position]).column(position).to_numpy()
        if len(pos) and (int(pos[0]) != seg.first or int(pos[-1]) != seg.last):
            report.add(
                "error",
                "misnamed",
                where,
                f"raw/{seg.path.name} holds positions {int(pos[0])}-{int(pos[-1])}",
            )
        if len(pos) > 1 and not bool(np.all(np.diff(pos) > 0)):
            report.add("error", "duplicate", where, f"raw/{seg.path.name} holds a position twice")
        parts.append(pos)
    every = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    unique, counts = np.unique(every, return_counts=True)
    twice = unique[counts > 1]
    if len(twice):
        report.add(
            "error",
            "duplicate",
            where,
            f"{len(twice)} positions are held twice in the raw lane (e.g. "
            f"{', '.join(map(str, twice[:5]))})",
        )
    return unique


def _twins(
    layout: LaneLayout,
    columns: MetadataColumns,
    topic: str,
    partition: int,
    listed: list[Segment],
    report: Report,
    where: str,
    undecided: list[tuple[int, int]],
) -> np.ndarray:
    """Each listed raw file's decoded twin holds its positions; the dead-letter file
    holds the twin's failed rows. Returns the positions that decoded; the ranges of
    missing twins go to ``undecided``."""
    decoded_dir = layout.partition_dir(Lane.DECODED, topic, partition)
    dlq_dir = layout.partition_dir(Lane.DLQ, topic, partition)
    position, error = columns.position, columns.decode_error
    good = []
    for seg in listed:
        raw = pq.read_table(seg.path, columns=[position]).column(position)
        twin = decoded_dir / seg.path.name
        if not twin.exists():
            report.add(
                "error",
                "twin_missing",
                where,
                f"decoded/{seg.path.name} is missing: decoded readers and the sinks fed "
                f"from the decoded lane miss positions {seg.first}-{seg.last} until it is "
                "decoded again from the raw lane (`twg stream` does it when it takes the "
                "partition: start it, or restart it if it runs)",
            )
            undecided.append((seg.first, seg.last + 1))
            continue
        names = pq.read_schema(twin).names
        table = pq.read_table(twin, columns=[c for c in (position, error) if c in names])
        if not table.column(position).equals(raw):
            report.add(
                "error",
                "twin_mismatch",
                where,
                f"decoded/{seg.path.name} does not hold its raw file's positions",
            )
            continue
        failed = (
            table.filter(pc.is_valid(table.column(error))).column(position)
            if error in names
            else raw.slice(0, 0)
        )
        dead = dlq_dir / seg.path.name
        held = (
            pq.read_table(dead, columns=[position]).column(position)
            if dead.exists()
            else failed.slice(0, 0)
        )
        if not held.equals(failed):
            report.add(
                "error",
                "dead_letters",
                where,
                f"dlq/{seg.path.name} holds {len(held)} records, the decoded twin "
                f"failed {len(failed)}: every failed record is a dead letter once",
            )
        ok = table.filter(pc.is_null(table.column(error))) if error in names else table
        good.append(ok.column(position).to_numpy())
    return np.concatenate(good) if good else np.zeros(0, np.int64)


def _from_first(coverage: list[tuple[int, int]], listed: list[Segment]) -> list[tuple[int, int]]:
    """The lane's coverage from where its first listed segment says it covers from.

    ``scan_coverage`` starts at the first file's first record; a segment whose footer
    covers positions before it (skipped offsets: a transaction marker, a compacted
    offset, every Pulsar boundary) holds those too. It matters once retention removed
    the segments before it: a sink covered those positions, and the floor (the last
    removed segment's end) stops short of the first record."""
    if not listed or not coverage:
        return coverage
    first = listed[0]
    try:
        start = covers_from(first)
    except (OSError, pa.ArrowException):
        return coverage  # an unreadable file is _raw_positions' finding
    return merge_ranges([(start, first.first), *coverage]) if start < first.first else coverage


def _orphans(
    layout: LaneLayout, topic: str, partition: int, report: Report, where: str, now: float
) -> None:
    """Decoded and dead-letter files with no raw file of their name on disk.

    The raw files are listed *after* the twins: a segment's twins are renamed before its
    raw file (lane/writer.py), so a listing taken first would call a segment rolled in
    between an orphan. A twin the raw listing still lacks is one only once it has had
    time to be joined (``SETTLE_S``): a write in flight renames its raw file next."""
    twins = [
        (lane, seg)
        for lane in (Lane.DECODED, Lane.DLQ)
        for seg in layout.segments(lane, topic, partition, retained=False, contained=True)
    ]
    raw_names = {
        s.path.name
        for s in layout.segments(Lane.RAW, topic, partition, retained=False, contained=True)
    }
    for lane, seg in twins:
        if seg.path.name not in raw_names:
            try:
                age = now - seg.path.stat().st_mtime
            except FileNotFoundError:
                continue  # gone meanwhile (retention, the start-up repair)
            if age <= SETTLE_S:
                continue
            report.add(
                "error",
                "orphan",
                where,
                f"{lane.value}/{seg.path.name} has no raw file (a reader of the "
                "directory counts its rows; start-up removes it)",
            )
