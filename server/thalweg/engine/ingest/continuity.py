"""Does the broker's log still continue the lane? Checks that never guess.

Offsets are only names: after a topic is recreated, a broker loses its data or is
restored from a backup, the same offsets name other records. Three checks catch it
(Kafka, where positions are offsets):

* the broker's log bounds against the lane's end — a log that starts after the lane's
  end (asked on assignment), or ends before it (the high watermark of every fetch
  response, checked every few seconds), does not continue it;
* on assignment, the record at the lane's last offset is fetched once more and compared
  with the lane's copy (key, value, timestamp): a recreated topic that has grown past
  the lane's end passes the bounds check but not this one;
* on every fetch, an offset below one already ingested (the client reset its position
  after the log shrank under it).

Any of them makes a :class:`~thalweg.lane.epochs.Divergence`; the runner stops the
partition. Pure functions over lane files and Arrow batches: no client here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from thalweg.lane.epochs import Divergence
from thalweg.lane.layout import Lane, LaneLayout
from thalweg.records.columns import MetadataColumns


@dataclass(frozen=True, slots=True)
class LastRecord:
    """The lane's copy of its last record, to compare with the broker's."""

    offset: int
    resume: int  # where the partition continues once the record matches
    key: Any
    value: Any
    timestamp: Any


def last_record(
    layout: LaneLayout, columns: MetadataColumns, topic: str, partition: int, resume: int
) -> LastRecord | None:
    """The last record of a partition's raw lane (None when the lane is empty)."""
    segments = layout.segments(Lane.RAW, topic, partition)
    if not segments:
        return None
    seg = segments[-1]
    names = [columns.position, columns.source("key"), columns.value, columns.timestamp]
    table = pq.read_table(seg.path, columns=names)
    row = table.slice(table.num_rows - 1, 1).to_pylist()[0]
    return LastRecord(
        int(row[columns.position]),
        resume,
        row[columns.source("key")],
        row[columns.value],
        row[columns.timestamp],
    )


def check_start(
    topic: str, partition: int, epoch: int, lane_end: int | None, log_start: int
) -> Divergence | None:
    """A divergence when the broker's log starts after a lane ending (exclusive) at
    ``lane_end``: the offsets between were never in the lane and are gone."""
    if lane_end is None or log_start <= lane_end:
        return None
    return _divergence(
        topic,
        partition,
        epoch,
        "log_start_above_lane",
        lane_end,
        log_start,
        None,
        f"the broker's log starts at {log_start}; offsets {lane_end}..{log_start - 1} "
        "are gone from it and were never in the lane",
    )


def check_record(expected: LastRecord, raw: pa.RecordBatch, columns: MetadataColumns) -> bool:
    """True unless ``raw`` holds ``expected.offset`` as another record.

    A batch without that offset (compacted away since, or a transaction marker) cannot
    tell, and the bounds check already passed: it counts as continuing.
    """
    positions = raw.column(columns.position)
    hits = pc.indices_nonzero(pc.equal(positions, expected.offset)).to_pylist()
    if not hits:
        return True
    row = (
        raw.slice(hits[0], 1)
        .select([columns.source("key"), columns.value, columns.timestamp])
        .to_pylist()[0]
    )
    return bool(
        row[columns.source("key")] == expected.key
        and row[columns.value] == expected.value
        and row[columns.timestamp] == expected.timestamp
    )


def record_mismatch(
    topic: str, partition: int, epoch: int, expected: LastRecord, log_end: int | None
) -> Divergence:
    return _divergence(
        topic,
        partition,
        epoch,
        "record_mismatch",
        expected.resume,
        None,
        log_end,
        f"the broker's record at offset {expected.offset} is not the lane's record there",
    )


def log_shrank(topic: str, partition: int, epoch: int, ingested: int, log_end: int) -> Divergence:
    return _divergence(
        topic,
        partition,
        epoch,
        "log_end_below_lane",
        ingested,
        None,
        log_end,
        f"the broker's log now ends at {log_end}, below {ingested}, already ingested",
    )


def offset_went_back(
    topic: str, partition: int, epoch: int, fetched: int, expected: int, log_end: int | None
) -> Divergence:
    return _divergence(
        topic,
        partition,
        epoch,
        "offset_went_back",
        expected,
        None,
        log_end,
        f"a fetch returned offset {fetched}, below {expected}, already ingested",
    )


def _divergence(
    topic: str,
    partition: int,
    epoch: int,
    reason: str,
    lane_end: int | None,
    log_start: int | None,
    log_end: int | None,
    detail: str,
) -> Divergence:
    return Divergence(
        topic=topic,
        partition=partition,
        epoch=epoch,
        reason=reason,
        lane_end=lane_end,
        broker_log_start=log_start,
        broker_log_end=log_end,
        detail=detail,
        detected_at=time.time(),
    )
