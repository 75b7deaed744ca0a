"""Compaction: a partition's small closed segments merged into target-size files.

A 5 s roll makes ~17,000 files per partition per day; readers, sinks and the file
system pay per file. Compaction merges runs of adjacent small segments (never the
newest, none younger than ``min_age_s``) into one file per run, in every lane at once:

* **Exact positions stay.** The merged file is named by its first and last position
  like any segment, and its footer keeps the run's ``covers_from`` / ``covers_to``, so
  coverage, exact replay and recovery read it as they read its parts. Its decoded twin
  is the parts' decoded twins concatenated, its dead letters theirs; the nodes' dead
  letters named after the parts are merged under its name too.
* **Nothing breaks meanwhile.** The merged twins are written first (dead letters,
  decoded, the nodes' dead letters, then raw last, each temp → fsync → rename; the raw
  one refusing to overwrite; a merge that fails removes the twins it wrote)
  and from the raw rename on, listings leave out the parts — a segment inside another
  is not listed (``LaneLayout.segments``) — so no read sees a position twice. The parts
  are deleted ``grace_s`` later, so a read that listed them keeps them. A crash between
  the steps leaves either the parts alone (a decoded or dead-letter merge without its
  raw file is removed at start as debris) or both, and start-up deletes the parts. The
  parts' raw files are deleted last (``coverage.remove_merged``), so a crash among the
  deletions leaves a raw part that start-up finds inside the merge.
* **Only the owner compacts** a partition (the gateway that ingests it), so two
  writers never merge the same files.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from thalweg.config.models import RawLaneConfig
from thalweg.config.retention import CompactionConfig
from thalweg.errors import SegmentConflictError
from thalweg.lane.coverage import META_COMPACTED, covers_from, is_compacted, remove_merged
from thalweg.lane.durable import write_file_durably
from thalweg.lane.layout import (
    META_COVERS_FROM,
    META_COVERS_TO,
    META_LANE,
    Lane,
    LaneLayout,
    Segment,
    segment_name,
)
from thalweg.lane.upkeep.retention import (
    META_NEWEST_AT,
    META_OLDEST_AT,
    lane_bytes,
    newest_at,
    oldest_at,
    upkeep_lock,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Merged:
    """One run merged: its file and how many it replaced."""

    path: Path
    parts: int


def plan_runs(
    layout: LaneLayout,
    topic: str,
    partition: int,
    cfg: CompactionConfig,
    now: float,
    *,
    span_s: float | None = None,
) -> list[list[Segment]]:
    """Runs of adjacent small segments to merge, oldest first.

    ``span_s``: the longest a run may span in time, from its first segment's oldest
    part to its last segment's newest (the times each was made durable). With retention
    by age a file goes only once its newest record is old enough: a merge spanning more
    would keep its oldest records past the bound, and a merged file that absorbed each
    new segment would never go at all.
    """
    segments = layout.segments(Lane.RAW, topic, partition)[:-1]  # never the newest
    runs: list[list[Segment]] = []
    run: list[Segment] = []
    size = 0
    began = 0.0  # when the oldest part of the run's first segment was made durable

    def close() -> None:
        nonlocal run, size
        if len(run) >= cfg.min_files:
            runs.append(run)
        run, size = [], 0

    for seg in segments:
        if now - seg.path.stat().st_mtime < cfg.min_age_s:
            break
        nbytes = lane_bytes(layout, topic, partition, seg)
        if nbytes >= cfg.target_bytes:
            close()
            continue
        # Adjacent: right after the run's end, or covering the gap after it (skipped
        # offsets) — never overlapping it: merged, an overlap would hold rows twice in
        # one file, where start-up's overlap check no longer sees it.
        after = seg.first > run[-1].last if run else True
        adjacent = not run or (
            after and (seg.first == run[-1].last + 1 or covers_from(seg) <= run[-1].last + 1)
        )
        at = newest_at(seg) if span_s is not None else 0.0
        if (
            not adjacent
            or size + nbytes > cfg.target_bytes
            or (span_s is not None and run and at - began > span_s)
        ):
            close()
        if not run:
            began = oldest_at(seg) if span_s is not None else 0.0
            if span_s is not None and at - began > span_s:
                continue  # already as wide as a run may be
        run.append(seg)
        size += nbytes
    close()
    return runs


def merge(
    layout: LaneLayout, topic: str, partition: int, run: list[Segment], raw_cfg: RawLaneConfig
) -> Merged | None:
    """Write ``run`` as one file in every lane; None when a part's decoded twin is
    missing (it is being decoded again: the run waits), or when two parts overlap (an
    anomaly start-up repair resolves: merged, it would hide rows held twice)."""
    with upkeep_lock(layout, topic, partition):
        return _merge(layout, topic, partition, run, raw_cfg)


def _merge(
    layout: LaneLayout, topic: str, partition: int, run: list[Segment], raw_cfg: RawLaneConfig
) -> Merged | None:
    floor = layout.floor(topic, partition)
    if run[0].first < floor:
        # The floor rose since the run was planned: its first parts are retention's now.
        # Merged, they would come back across the floor; the rest is merged next pass.
        log.info(
            "%s[%d]: merge of %s-%s skipped: the retention floor rose to %d",
            topic,
            partition,
            run[0].first,
            run[-1].last,
            floor,
        )
        return None
    overlapping = [(a, b) for a, b in pairwise(run) if b.first <= a.last]
    if overlapping:
        a, b = overlapping[0]
        log.error(
            "%s[%d]: not merging %s with %s: they overlap (start-up repair resolves it)",
            topic,
            partition,
            a.path.name,
            b.path.name,
        )
        return None
    name = segment_name(run[0].first, run[-1].last)
    decoded_dir = layout.partition_dir(Lane.DECODED, topic, partition)
    has_decoded = [(decoded_dir / s.path.name).exists() for s in run]
    if any(has_decoded) and not all(has_decoded):
        return None
    last_meta = pq.read_schema(run[-1].path).metadata or {}
    meta = {
        META_COVERS_FROM: str(covers_from(run[0])).encode(),
        META_COVERS_TO: last_meta.get(META_COVERS_TO, str(run[-1].last + 1).encode()),
        META_COMPACTED: b"1",
        # Its age is its newest record's, its span from its oldest, for retention (the
        # file itself is written now).
        META_NEWEST_AT: repr(max(newest_at(s) for s in run)).encode(),
        META_OLDEST_AT: repr(min(oldest_at(s) for s in run)).encode(),
    }
    twins: list[Path] = []  # written before the raw file: removed if it is not
    try:
        for lane in (Lane.DLQ, Lane.DECODED):
            directory = layout.partition_dir(lane, topic, partition)
            parts = [directory / s.path.name for s in run if (directory / s.path.name).exists()]
            if parts:
                _write(
                    directory / name,
                    _concat(parts),
                    {**meta, META_LANE: lane.value.encode()},
                    raw_cfg,
                    exclusive=False,
                )
                twins.append(directory / name)
        twins += _merge_node_dead_letters(layout, topic, partition, run, name, raw_cfg)
        raw_dir = layout.partition_dir(Lane.RAW, topic, partition)
        raw_parts = [raw_dir / s.path.name for s in run]
        # Raw last: it makes the merge visible (and its parts, with their twins, deletable).
        _write(
            raw_dir / name,
            _concat(raw_parts),
            {**meta, META_LANE: Lane.RAW.value.encode()},
            raw_cfg,
            exclusive=True,
        )
    except SegmentConflictError:
        raise  # another writer's merge of that name: its twins are not ours to remove
    except BaseException:
        # A full disk, say: the parts stay as they were, and the twins of a merge that
        # did not land are removed now — they would hold space the ingest needs, and
        # readers of the directories would see their rows twice.
        for path in twins:
            path.unlink(missing_ok=True)
        raise
    return Merged(layout.partition_dir(Lane.RAW, topic, partition) / name, len(run))


def sweep_merged(
    layout: LaneLayout, topic: str, partition: int, grace_s: float, now: float | None = None
) -> int:
    """Delete the parts of merges done at least ``grace_s`` ago; the files removed."""
    now = time.time() if now is None else now
    segments = layout.segments(Lane.RAW, topic, partition, retained=False, contained=True)
    keeper: Segment | None = None
    due: list[Segment] = []
    for seg in segments:  # sorted by first, widest first
        if keeper is None or seg.first > keeper.last:
            keeper = seg
            continue
        if (
            seg.last <= keeper.last
            and is_compacted(keeper)
            and keeper.path.stat().st_mtime + grace_s <= now
        ):
            due.append(seg)
    return remove_merged(layout, topic, partition, due) if due else 0


def files_per_partition(layout: LaneLayout, topic: str, partition: int) -> int:
    """Raw files on disk (parts awaiting deletion included)."""
    return len(layout.segments(Lane.RAW, topic, partition, retained=False, contained=True))


def _concat(paths: list[Path]) -> pa.Table:
    """The files' rows in order, with the first file's footer metadata (the prefix)."""
    tables = [pq.read_table(p) for p in paths]
    meta = tables[0].schema.metadata
    merged = pa.concat_tables(
        [t.replace_schema_metadata(None) for t in tables], promote_options="permissive"
    )
    return merged.replace_schema_metadata(meta)


def _merge_node_dead_letters(
    layout: LaneLayout,
    topic: str,
    partition: int,
    run: list[Segment],
    name: str,
    raw_cfg: RawLaneConfig,
) -> list[Path]:
    """The nodes' dead letters of the run's parts under the merge's name (before its raw
    file lands: once it has, the parts and their dead letters may be deleted); the files
    written."""
    written = []
    for node in layout.nodes():
        directory = layout.node_dead_letter_dir(node, topic, partition)
        parts = [directory / s.path.name for s in run if (directory / s.path.name).exists()]
        if parts:
            _write(directory / name, _concat(parts), {}, raw_cfg, exclusive=False)
            written.append(directory / name)
    return written


def _write(
    path: Path,
    table: pa.Table,
    meta: dict[bytes, bytes],
    raw_cfg: RawLaneConfig,
    *,
    exclusive: bool,
) -> None:
    """Whole or absent; the raw file ``exclusive`` (never over an existing name)."""
    compression = None if raw_cfg.compression == "none" else raw_cfg.compression
    level = raw_cfg.compression_level if compression in ("zstd", "gzip") else None
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    try:
        write_file_durably(
            path,
            lambda tmp: pq.write_table(
                table, tmp, compression=compression, compression_level=level
            ),
            exclusive=exclusive,
        )
    except FileExistsError as exc:
        raise SegmentConflictError(f"merged segment {path} already exists") from exc
