"""Rows deleted from a destination behind the gateway's back, found by the feeder.

A destination's coverage says which positions it holds; nothing in it changes when a
person (or a retention job, or a restore from an old backup of the rows but not of the
record) deletes rows from a table that is still there. ``twg verify`` names it
(``sink_missing``); the running feeder finds it itself, when it opens and every
``recovery.recheck_every_flushes`` flushes, and makes those positions gaps again so its
next pass feeds them once more — the destination then holds each record once again.

The check asks the lane what the destination should hold (``recovery.expected``, the
answer verify uses) and the destination what it does (``Sink.holds``). It runs with no
commit in flight (the feeder settles first), so what the coverage store claims is
exactly what the destination committed. Only the positions found missing are fed again:
an append destination is never sent a row it still holds.

Where it does not run, and why (each named in docs/sinks.md):

* a destination that cannot read its rows back (``Capabilities.reads_back``: Flight);
* a routed one (a table per field value): its replay skips what its own record covers,
  so a row fed again would not go in;
* a sink fed through a pipeline node: its rows are derived, any number per record;
* a partition in a later epoch (a broker that came back with other offsets): rows carry
  no epoch, so positions of two epochs cannot be told apart in the destination.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from thalweg.config.sinks import Upserts
from thalweg.lane.epochs import current_epoch
from thalweg.lane.layout import LaneLayout
from thalweg.records.columns import MetadataColumns
from thalweg.records.ranges import merge_ranges, subtract_ranges
from thalweg.recovery.expected import (
    absent,
    as_ranges,
    folded,
    held_positions,
    lane_positions,
    of_topic,
)
from thalweg.recovery.refused import SinkDeadLetters
from thalweg.sinks.base import Ranges, Sink


def rechecks(sink: Sink[Any], *, derived: bool) -> bool:
    """Whether the feeder of ``sink`` looks for rows deleted behind it (``derived``: fed
    through a pipeline node)."""
    return sink.capabilities.detects_deleted_rows and not sink.routed and not derived


def deleted_behind(
    sink: Sink[Any], layout: LaneLayout, columns: MetadataColumns, covered: Ranges
) -> Ranges:
    """Per (topic, partition, epoch), the positions ``covered`` (the coverage store,
    which the destination's own record was taken into) says the destination holds and
    the lane gives it a row for, that the destination does not hold now: half-open
    ranges, one per run of missing positions. Blocking: it reads the destination."""
    cfg = sink.cfg
    wanted = [columns.partition, columns.position, columns.record_id, columns.source("topic")]
    held = sink.holds(wanted)
    refused = SinkDeadLetters(layout, sink.name, columns)
    upsert = isinstance(cfg, Upserts) and cfg.mode == "upsert"
    out: Ranges = {}
    for topic in cfg.topics:
        table = of_topic(held.rows.get(topic), columns, topic)  # None: the table is gone
        if table is not None and not {columns.partition, columns.position} <= set(
            table.column_names
        ):
            continue  # rows that do not say where they came from: nothing to compare
        for partition in layout.partitions(topic):
            key = (topic, partition, 0)
            if current_epoch(layout, topic, partition):
                continue
            window = subtract_ranges(
                merge_ranges(covered.get(key, [])), [(0, layout.floor(topic, partition))]
            )
            if not window:
                continue
            want = lane_positions(layout, columns, topic, partition, window, raw=cfg.raw)
            if len(want):  # ascending; a position twice (a segment mid-merge) counts once
                want = want[np.concatenate(([True], np.diff(want) != 0))]
            want = absent(want, refused.held(topic, partition))
            if upsert:
                want = folded(layout, cfg, columns, topic, partition, want)
            got = (
                np.zeros(0, np.int64)
                if table is None
                else held_positions(table, columns, partition, window)
            )
            lost = as_ranges(absent(want, got))
            if lost:
                out[key] = lost
    return out
