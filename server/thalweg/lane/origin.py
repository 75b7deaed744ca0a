"""Where a partition's lane began: its first segment's first position, recorded apart
from the segments.

A lane's first segment is the only witness of where the lane starts. Lose it (a file
deleted by hand, a restore that missed it) and the lane simply starts later: nothing in
the remaining files says positions are missing. The broker's log start cannot say it
either — a lane begun at ``auto_offset_reset = "latest"``, or at a group commit, starts
above the log on purpose. So the writer notes the position the lane accounts for from
(its first segment's ``covers_from``) in a file of its own, durably, *before* that
segment's raw file is renamed into place; ``twg verify`` then compares the lane's first
segment with it (and with the retention floor, which explains every position below it).

``raw/topic=<t>/partition=<p>/_origin.json``: ``{"position": N}``. It lives in the raw
partition directory, so closing an epoch moves it with the epoch's files. It is written
only while the partition's raw directory holds no segment: a crash between it and the
first segment leaves a record of a lane that holds nothing, which the next first
segment replaces.
"""

from __future__ import annotations

import json

from thalweg.errors import LaneError
from thalweg.lane.durable import write_json_durably
from thalweg.lane.layout import Lane, LaneLayout

ORIGIN = "_origin.json"


def read_origin(layout: LaneLayout, topic: str, partition: int) -> int | None:
    """The position the partition's lane was begun at; None when no record was kept
    (a lane written before this record existed, or an object-store lane read from the
    bucket, where only segments are kept).

    Raises:
        LaneError: the record exists and cannot be read.
    """
    path = layout.partition_dir(Lane.RAW, topic, partition) / ORIGIN
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        return int(body["position"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LaneError(f"{path}: unreadable record of the lane's origin: {exc}") from exc


def record_origin(layout: LaneLayout, topic: str, partition: int, position: int) -> None:
    """Note durably that the partition's lane begins at ``position``."""
    path = layout.partition_dir(Lane.RAW, topic, partition) / ORIGIN
    write_json_durably(path, {"position": int(position)})
