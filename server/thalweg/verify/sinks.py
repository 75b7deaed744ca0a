"""One sink checked against the lane and against its destination, read-only.

Three records of what a sink holds must agree: its coverage store beside the lane
(``data_dir/coverage/<sink>.json``), the destination's own record (the Iceberg snapshot
summary, the Postgres coverage table, the Arrow IPC file names), and the rows
themselves. Per partition of its topics, in the current epoch:

* the coverage never runs ahead of the lane (above the floor: retention removes lane
  data a sink keeps) and the store never claims what the destination does not;
* inside the coverage, above the floor, the destination holds each position the lane
  says it should exactly once — a decoded sink the rows that decoded, a raw sink every
  row, an upsert sink (``mode = "upsert"``) each key's newest row that is not a delete
  (the fold of the lane, docs/cdc.md) — and nothing else (a dropped table shows as every
  position missing).

Nothing here writes: no table or namespace is created, no temp file removed (a feeder
may be running), the feeder lock is not taken. Sinks fed through a pipeline node hold
derived rows (any number per record): only their coverage is checked. The Flight sink's
destination keeps no record: its store alone is checked against the lane.

Which positions a destination should hold is ``recovery.expected``, which the running
feeder asks too (it feeds again what was deleted behind its back); what it holds, each
destination answers itself (``Sink.holds``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from thalweg.config.models import ThalwegConfig
from thalweg.config.sinks import Upserts
from thalweg.lane.layout import LaneLayout
from thalweg.records.columns import MetadataColumns
from thalweg.records.ranges import merge_ranges, subtract_ranges
from thalweg.recovery.coverage import CoverageStore
from thalweg.recovery.expected import folded, held_positions, inside, of_topic
from thalweg.recovery.refused import SinkDeadLetters
from thalweg.sinks.base import Ranges, Sink
from thalweg.sinks.contract import Held
from thalweg.sinks.loader import load_sink_class
from thalweg.verify.lanes import LaneAudit
from thalweg.verify.report import Report


@dataclass(frozen=True, slots=True)
class SinkState:
    """What a sink holds, read before the lanes are (``read_sink``)."""

    store: Ranges
    dest: Held


def read_sink(cfg: ThalwegConfig, name: str, columns: MetadataColumns, report: Report) -> SinkState:
    """Sink ``name``'s coverage store, then its destination — read *before* the lanes.

    Beside a running gateway each record only grows, and in this order each trails the
    next: the store is written after the destination's commit, and a sink lands only
    what the lane already holds. Read in the other order, a flush landing between the
    reads would look like a sink ahead of its lane, rows the lane has none for, or a
    store ahead of its destination."""
    sink_cfg = next(s for s in cfg.sinks if s.name == name)
    try:
        store = CoverageStore(cfg.gateway.data_dir, name).snapshot()
    except Exception as exc:  # an unreadable store is a finding, not a crash
        report.add("error", "store_unreadable", f"sink {name}", str(exc))
        store = {}
    # The topic too: routed tables without {topic} in the name hold several topics.
    wanted = [columns.partition, columns.position, columns.record_id, columns.source("topic")]
    try:
        dest = destination(cfg, sink_cfg).holds(wanted)
    except Exception as exc:  # the destination did not answer: say so, check the rest
        report.add("error", "destination_unreadable", f"sink {name}", _one_line(exc))
        dest = Held(None, {})
    return SinkState(store, dest)


def destination(cfg: ThalwegConfig, sink_cfg: Any) -> Sink[Any]:
    """The configured sink, not opened: what verify and recover ask about the
    destination (``Sink.holds``, ``Sink.rebuild_step``, ``Sink.capabilities``)."""
    cls = load_sink_class(sink_cfg.kind)
    return cls(sink_cfg, Path(cfg.gateway.data_dir), MetadataColumns(cfg.gateway.metadata_prefix))


def audit_sink(
    cfg: ThalwegConfig,
    name: str,
    columns: MetadataColumns,
    lanes: dict[tuple[str, int], LaneAudit],
    report: Report,
    state: SinkState,
    layout: LaneLayout,
) -> None:
    """Check sink ``name``, as ``state`` holds it, against the ``lanes`` audited after
    it was read (``layout``: the lanes as audited — a bucket's fetched copy); findings
    and a summary go to ``report``."""
    sink_cfg = next(s for s in cfg.sinks if s.name == name)
    derived = any(n.sink == name for n in cfg.pipeline.nodes)
    store, dest = state.store, state.dest
    checked = missing = extra = twice = refused = 0
    for (topic, p), lane in sorted(lanes.items()):
        if topic not in sink_cfg.topics:
            continue
        where = f"sink {name}: {topic}[{p}]"
        key = (topic, p, lane.epoch)
        held = merge_ranges(store.get(key, []))
        claimed = merge_ranges(dest.coverage.get(key, [])) if dest.coverage is not None else held
        if dest.coverage is not None and subtract_ranges(held, claimed):
            _store_ahead(
                layout, name, sink_cfg, columns, lane, subtract_ranges(held, claimed), where, report
            )
        ahead = subtract_ranges(subtract_ranges(claimed, lane.coverage), [(0, lane.floor)])
        if ahead:
            report.add(
                "error",
                "sink_ahead",
                where,
                f"covers {_show(ahead)}, beyond what the lane holds",
            )
        table = of_topic(dest.rows.get(topic), columns, topic)
        if derived or topic not in dest.rows:
            continue  # derived rows, or a destination without rows to read (flight)
        if lane.epoch:
            report.add(
                "warning",
                "epoch_rows",
                where,
                "rows of closed epochs share positions: checked by coverage only",
            )
            continue
        window = subtract_ranges(merge_ranges(claimed), [(0, lane.floor)])
        if not sink_cfg.raw:
            window = subtract_ranges(window, lane.undecided)
        want = inside(lane.raw_positions if sink_cfg.raw else lane.decoded_positions, window)
        want, set_aside = _without_refused(layout, name, columns, topic, p, want, where, report)
        refused += set_aside
        if isinstance(sink_cfg, Upserts) and sink_cfg.mode == "upsert":
            want = folded(layout, sink_cfg, columns, topic, p, want)
        counts = _check_rows(table, want, window, columns, p, where, report)
        checked, missing, twice, extra = (
            x + y for x, y in zip((checked, missing, twice, extra), counts, strict=True)
        )
    report.sinks[name] = {
        "kind": sink_cfg.kind,
        "derived": derived,
        "records_checked": checked,
        "missing": missing,
        "duplicates": twice,
        "extra": extra,
        "refused": refused,
        "summary": (
            f"{sink_cfg.kind}, coverage only (derived rows)"
            if derived
            else f"{sink_cfg.kind}, coverage only (the destination keeps no rows to read)"
            if dest.coverage is None and not dest.rows
            else f"{sink_cfg.kind}, {checked} records checked: {missing} missing, "
            f"{twice} twice, {extra} extra, {refused} refused and set aside"
        ),
    }


def _store_ahead(
    layout: LaneLayout,
    name: str,
    sink_cfg: Any,
    columns: MetadataColumns,
    lane: LaneAudit,
    gap: list[tuple[int, int]],
    where: str,
    report: Report,
) -> None:
    """The coverage store claims ``gap``, the destination's own record does not: an
    error, unless the lane gives the sink no row there. A destination records coverage
    with its rows, and a flush of none before the table exists (every record a dead
    letter, an Iceberg table made by its first rows) leaves nothing to record it in;
    nothing is missing, and the feeder's next start replays those positions into the
    record. Any row the sink would take there (a decoded row, for a sink fed through a
    node too: the node may have kept it) keeps it an error."""
    above = subtract_ranges(gap, [(0, lane.floor)])
    rows = inside(lane.raw_positions if sink_cfg.raw else lane.decoded_positions, above)
    rows, _ = _without_refused(
        layout, name, columns, lane.topic, lane.partition, rows, where, Report()
    )
    # Below the floor the lane no longer says; a decoded twin being rebuilt does not
    # say yet: either is an error still.
    unknown = subtract_ranges(gap, above) or (
        not sink_cfg.raw and subtract_ranges(above, subtract_ranges(above, lane.undecided))
    )
    if len(rows) or unknown:
        report.add(
            "error",
            "store_ahead",
            where,
            f"the coverage store claims {_show(gap)}, the destination's own record does not",
        )
    else:
        report.add(
            "warning",
            "store_ahead_no_rows",
            where,
            f"the coverage store claims {_show(gap)}, the destination's own record does "
            "not; the lane gives this sink no row there (a flush of none before its table "
            "existed): nothing is missing, the feeder's next start records it",
        )


def _without_refused(
    layout: LaneLayout,
    sink: str,
    columns: MetadataColumns,
    topic: str,
    partition: int,
    want: np.ndarray,
    where: str,
    report: Report,
) -> tuple[np.ndarray, int]:
    """The positions the destination should hold less those its dead-letter lane holds
    (records it refused: ``recovery.refused``); a position set aside twice is a finding.
    Read from ``layout``, the lanes as audited: ``data_dir``, or the bucket's copy, which
    holds the sink's dead-letter lane too (``lane/remote/refused_sync.py``)."""
    held = SinkDeadLetters(layout, sink, columns).held(topic, partition)
    if not len(held):
        return want, 0
    unique, counts = np.unique(held, return_counts=True)
    if (counts > 1).any():
        twice = unique[counts > 1]
        report.add(
            "error",
            "refused_twice",
            where,
            f"{len(twice)} records are in the sink's dead-letter lane more than once (e.g. "
            f"positions {', '.join(map(str, twice[:5]))})",
        )
    return np.setdiff1d(want, unique, assume_unique=True), len(unique)


def _check_rows(
    table: pa.Table | None,
    want: np.ndarray,
    window: list[tuple[int, int]],
    columns: MetadataColumns,
    partition: int,
    where: str,
    report: Report,
) -> tuple[int, int, int, int]:
    """The destination's rows of one partition inside ``window`` against the positions
    the lane says it should hold; (checked, missing, twice, extra)."""
    got = (
        np.zeros(0, np.int64)
        if table is None
        else held_positions(table, columns, partition, window)
    )
    unique, counts = np.unique(got, return_counts=True)
    lost = np.setdiff1d(want, unique, assume_unique=True)
    more = np.setdiff1d(unique, want, assume_unique=True)
    dup = unique[counts > 1]
    if table is None and len(want):
        report.add(
            "error",
            "table_missing",
            where,
            f"the destination has no table, its coverage claims {_show(window)}",
        )
    elif len(lost):
        report.add(
            "error",
            "sink_missing",
            where,
            f"{len(lost)} covered records are not in the destination (e.g. positions "
            f"{', '.join(map(str, lost[:5]))})",
        )
    if len(dup):
        report.add(
            "error",
            "sink_duplicate",
            where,
            f"{len(dup)} records are in the destination more than once (e.g. positions "
            f"{', '.join(map(str, dup[:5]))})",
        )
    if len(more):
        report.add(
            "error",
            "sink_extra",
            where,
            f"{len(more)} rows at positions the lane gives no row for (e.g. "
            f"{', '.join(map(str, more[:5]))})",
        )
    return len(want), len(lost), len(dup), len(more)


def _show(ranges: list[tuple[int, int]]) -> str:
    shown = ", ".join(f"{a}-{b - 1}" for a, b in ranges[:4])
    return shown + (f" and {len(ranges) - 4} more" if len(ranges) > 4 else "")


def _one_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
