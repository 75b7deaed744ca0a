"""Epochs: a partition's lane across broker logs that do not continue one another.

A broker log can stop continuing the lane written from it: the topic was deleted and
recreated, the broker lost its data or was restored from a backup, or retention removed
more than the lane holds. Its offsets then name other records than the lane's. Writing
on would put two records under one offset, so the engine stops the partition and writes
a **divergence marker** (``_diverged.json``) in its raw directory — durable, so a restart
stays stopped instead of guessing again.

What happens next is the operator's choice (``on_divergence = "new_epoch"`` or the
``lane.new-epoch`` Flight action): the partition's files in every lane move, unchanged,
to ``epochs/epoch=N/<lane>/topic=T/partition=P/`` — the closed epoch, a lane of its own
that stays readable — and the partition starts again, empty, in epoch N + 1 at the
broker's log start. Record ids of epochs above 0 include the epoch, so ids never
collide across epochs, and no directory ever holds two generations of one offset.

Closing is crash-safe: files move one rename at a time (decoded and dead-letter lanes
first, raw last) and the marker moves last of all, so a crash leaves the marker where
it was and closing simply runs again on the files that are left.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from thalweg.errors import LaneError
from thalweg.lane.durable import TMP_MARK, ensure_dir, fsync_dir, write_json_durably
from thalweg.lane.layout import Lane, LaneLayout

log = logging.getLogger(__name__)

DIVERGED = "_diverged.json"
CLOSED = "_closed.json"
EPOCHS_DIR = "epochs"
_EPOCH_PREFIX = "epoch="


@dataclass(frozen=True, slots=True)
class Divergence:
    """Why a partition's broker log no longer continues its lane."""

    topic: str
    partition: int
    epoch: int
    reason: str  # one of REASONS
    lane_end: int | None
    broker_log_start: int | None
    broker_log_end: int | None
    detail: str
    detected_at: float = 0.0

    def describe(self) -> str:
        """One line for the log and /health."""
        return (
            f"{self.topic}[{self.partition}] epoch {self.epoch}: the broker's log no longer "
            f"continues the lane ({self.reason}: {self.detail}); lane_end={self.lane_end} "
            f"broker_log_start={self.broker_log_start} broker_log_end={self.broker_log_end}; "
            "the partition is stopped (docs/operations.md, 'The broker's offsets went "
            "backwards')"
        )

    def info(self) -> dict[str, object]:
        return asdict(self)


# Why a divergence was declared (the ``reason`` of a marker and the metric label).
REASONS = (
    "log_end_below_lane",  # the broker's log ends before the lane does
    "log_start_above_lane",  # records between the lane's end and the log start are gone
    "record_mismatch",  # the broker's record at the lane's last offset is another record
    "offset_went_back",  # a fetch returned an offset below one already ingested
)


def epoch_layout(layout: LaneLayout, epoch: int) -> LaneLayout:
    """The lane root holding closed epoch ``epoch`` (of any partition closed at it)."""
    return LaneLayout(layout.root / EPOCHS_DIR / f"{_EPOCH_PREFIX}{epoch}")


def closed_epochs(layout: LaneLayout, topic: str, partition: int) -> list[int]:
    """The closed epochs of one partition, ascending."""
    base = layout.root / EPOCHS_DIR
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if name.startswith(_EPOCH_PREFIX) and name[len(_EPOCH_PREFIX) :].isdigit():
            n = int(name[len(_EPOCH_PREFIX) :])
            if epoch_layout(layout, n).partition_dir(Lane.RAW, topic, partition).is_dir():
                out.append(n)
    return sorted(out)


def read_divergence(layout: LaneLayout, topic: str, partition: int) -> Divergence | None:
    """The partition's divergence marker, when it has one."""
    path = layout.partition_dir(Lane.RAW, topic, partition) / DIVERGED
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LaneError(f"{path}: unreadable divergence marker: {exc}") from exc
    return Divergence(**body)


def current_epoch(layout: LaneLayout, topic: str, partition: int) -> int:
    """The epoch the partition's current lane belongs to (0 until one is closed)."""
    marker = read_divergence(layout, topic, partition)
    if marker is not None:
        return marker.epoch
    closed = closed_epochs(layout, topic, partition)
    return closed[-1] + 1 if closed else 0


def mark_diverged(layout: LaneLayout, divergence: Divergence) -> None:
    """Write the divergence marker durably (temp → fsync → rename → dir fsync)."""
    d = layout.partition_dir(Lane.RAW, divergence.topic, divergence.partition)
    ensure_dir(d)
    write_json_durably(d / DIVERGED, divergence.info())


def close_epoch(layout: LaneLayout, topic: str, partition: int) -> int:
    """Move a diverged partition's files into its closed epoch; the new epoch's number.

    Raises:
        LaneError: the partition has no divergence marker (nothing to close), or a file
            could not be moved.
    """
    marker = read_divergence(layout, topic, partition)
    if marker is None:
        raise LaneError(
            f"{topic}[{partition}] has not diverged; only a diverged partition's epoch "
            "can be closed"
        )
    target = epoch_layout(layout, marker.epoch)
    try:
        for lane in (Lane.DLQ, Lane.DECODED, Lane.RAW):
            _move_files(
                layout.partition_dir(lane, topic, partition),
                target.partition_dir(lane, topic, partition),
            )
        floor = layout.floor_path(topic, partition)
        if floor.exists():  # the closed epoch keeps its retention floor; the new one has none
            ensure_dir(target.floor_path(topic, partition).parent)
            os.rename(floor, target.floor_path(topic, partition))
            fsync_dir(floor.parent)
        src = layout.partition_dir(Lane.RAW, topic, partition)
        dst = target.partition_dir(Lane.RAW, topic, partition)
        closed = {**marker.info(), "closed_at": time.time()}
        write_json_durably(dst / CLOSED, closed)
        (src / DIVERGED).unlink()
        fsync_dir(src)
    except OSError as exc:
        raise LaneError(f"closing epoch {marker.epoch} of {topic}[{partition}]: {exc}") from exc
    log.warning(
        "%s[%d]: epoch %d closed (lane end %s) into %s; epoch %d starts at the broker's log",
        topic,
        partition,
        marker.epoch,
        marker.lane_end,
        target.root,
        marker.epoch + 1,
    )
    return marker.epoch + 1


def _move_files(src: Path, dst: Path) -> None:
    try:
        names = sorted(os.listdir(src))
    except FileNotFoundError:
        return
    ensure_dir(dst)
    for name in names:
        if name == DIVERGED or TMP_MARK in name:
            continue
        if (dst / name).exists():
            # Moved by an earlier, interrupted close; this copy was rebuilt since (a
            # decoded segment re-derived from raw). The closed epoch keeps its own.
            (src / name).unlink()
            continue
        os.rename(src / name, dst / name)
    fsync_dir(dst)
    fsync_dir(src)
