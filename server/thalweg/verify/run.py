"""``twg verify``: the lanes, the cluster's positions and the sinks of one
configuration checked against each other, read-only (``docs/operations.md``).

Safe beside a running gateway: nothing is written, locked or created. A bucket lane
(``data_dir = "s3://..."``) is checked as readers resolve it: each partition's newest
generation of every object, fetched into a temporary directory (the bucket is only
read), plus the twin objects no raw object stands for (orphans).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from thalweg.config.models import KafkaSourceConfig, ThalwegConfig
from thalweg.errors import ConfigError, ThalwegError
from thalweg.lane.layout import Lane, LaneLayout
from thalweg.lane.liveness import writer_running
from thalweg.records.columns import MetadataColumns
from thalweg.verify.lanes import LaneAudit, audit_partition, start_missing
from thalweg.verify.report import PartitionSummary, Report
from thalweg.verify.sinks import audit_sink, read_sink

if TYPE_CHECKING:
    from thalweg.kafka.offsets import PartitionOffsets
    from thalweg.verify.deep import DeepRange


def verify(
    cfg: ThalwegConfig,
    *,
    topic: str | None = None,
    sink: str | None = None,
    broker: bool = True,
    deep: bool = False,
    partition: int | None = None,
    since_ms: int | None = None,
) -> Report:
    """Check everything the configuration names (or only ``topic`` / ``sink``).

    ``deep`` also compares each record the broker retains with the raw lane
    (``verify/deep.py``), only of ``partition`` and from ``since_ms`` when given.
    """
    if deep and not broker:
        raise ConfigError("--deep reads the records back from the broker: drop --no-broker")
    report = Report()
    columns = MetadataColumns(cfg.gateway.metadata_prefix)
    # Beside a running gateway everything grows while it is read: what must trail the
    # lane (the sinks' records, the group's commit) is read before it, what must lead
    # it (the broker's log end) after it — so a flush, a roll or a commit in between is
    # never taken for a fault.
    chosen = [
        s.name
        for s in cfg.sinks
        if (sink is None or s.name == sink) and (topic is None or topic in s.topics)
    ]
    states = {name: read_sink(cfg, name, columns, report) for name in chosen}
    committed = _broker_offsets(cfg, topic, report) if broker else {}
    stopped = not _writing(cfg)
    report.stopped = stopped
    with tempfile.TemporaryDirectory(prefix="twg-verify-") as tmp:
        layout = (
            _bucket_copy(cfg, Path(tmp), topic, report)
            if cfg.gateway.lanes_in_object_store
            else LaneLayout(cfg.gateway.data_dir)
        )
        topics = _topics(cfg, layout, topic)
        if (
            topic is not None
            and not layout.partitions(topic)
            and not any(topic in (getattr(s, "topics", None) or []) for s in cfg.sources)
        ):
            raise ConfigError(f"no topic {topic!r} in the lane or the configuration")
        lanes: dict[tuple[str, int], LaneAudit] = {}
        for t in topics:
            for p in layout.partitions(t):
                lanes[(t, p)] = audit_partition(layout, columns, t, p, report, stopped=stopped)
        summaries = {
            key: PartitionSummary(a.topic, a.partition, a.epoch, a.coverage, a.rows, a.floor)
            for key, a in lanes.items()
        }
        if broker:
            late = Report()
            logs = _broker_offsets(cfg, topic, late)
            said = {(f.code, f.where) for f in report.findings}
            report.findings += [f for f in late.findings if (f.code, f.where) not in said]
            earliest = _from_earliest(cfg)
            _check_broker(topics, committed, logs, lanes, summaries, report, earliest)
            _check_unheld(topics, committed, lanes, report, stopped, earliest)
            if deep:
                from thalweg.verify.deep import run_deep  # aiokafka: only when asked

                plans = _deep_plans(
                    cfg, layout, columns, topics, lanes, logs, report, partition, since_ms
                )
                run_deep(plans, columns, report)
        report.partitions = [summaries[k] for k in sorted(summaries)]
        for name in chosen:
            audit_sink(cfg, name, columns, lanes, report, states[name], layout)
    return report


def _deep_plans(
    cfg: ThalwegConfig,
    layout: LaneLayout,
    columns: MetadataColumns,
    topics: list[str],
    lanes: dict[tuple[str, int], LaneAudit],
    logs: dict[tuple[str, int], PartitionOffsets],
    report: Report,
    partition: int | None,
    since_ms: int | None,
) -> list[tuple[KafkaSourceConfig, list[DeepRange]]]:
    """What ``--deep`` reads per Kafka source: each chosen partition's lane coverage cut
    to what the broker's log still holds. A Pulsar topic is named as not checked."""
    from thalweg.lane.epochs import read_divergence
    from thalweg.verify.deep import plan_range

    plans = []
    for src in cfg.sources:
        chosen = [t for t in (getattr(src, "topics", None) or []) if t in topics]
        if not isinstance(src, KafkaSourceConfig):
            for t in chosen:
                report.add(
                    "warning",
                    "deep_unchecked",
                    t,
                    "--deep reads Kafka topics back; Pulsar's are not compared",
                )
            continue
        ranges = []
        for t in chosen:
            for p in layout.partitions(t):
                lane, log = lanes.get((t, p)), logs.get((t, p))
                if (partition is not None and p != partition) or lane is None or not lane.coverage:
                    continue
                if log is None or log.log_end is None:
                    report.add(
                        "warning", "deep_incomplete", f"{t}[{p}]", "no log end from the broker"
                    )
                    continue
                if read_divergence(layout, t, p) is not None or log.log_end < lane.coverage[-1][1]:
                    # The broker's log no longer continues this lane (lane_ahead_of_log):
                    # its offsets name other records now; the lane's are held, not lost.
                    report.add(
                        "warning",
                        "deep_diverged",
                        f"{t}[{p}]",
                        "the broker's log no longer continues the lane: its records are "
                        "not compared with the broker's (the gateway holds the partition "
                        "until a new epoch: docs/operations.md)",
                    )
                    continue
                bounds = (
                    max(lane.coverage[0][0], log.log_start or 0),
                    min(lane.coverage[-1][1], log.log_end),
                )
                if bounds[0] >= bounds[1]:
                    continue  # the broker retains nothing of the lane
                plan = plan_range(layout, columns, t, p, bounds, since_ms, lane.elsewhere)
                if plan is not None:
                    ranges.append(plan)
        if ranges:
            plans.append((src, ranges))
    return plans


def _writing(cfg: ThalwegConfig) -> bool:
    """Whether a gateway (or a batch run) writes the lanes now (lane/liveness.py). A
    bucket lane whose cache is not on this host may be written elsewhere: taken as
    running, so nothing a running writer finishes is named a fault."""
    root = Path(cfg.gateway.data_dir)
    if cfg.gateway.lanes_in_object_store and not root.is_dir():
        return True
    return writer_running(root)


def _from_earliest(cfg: ThalwegConfig) -> frozenset[str]:
    """The topics a Kafka source reads from the earliest (``auto_offset_reset``): their
    lanes begin at the broker's log start unless something records otherwise."""
    return frozenset(
        t
        for src in cfg.sources
        if isinstance(src, KafkaSourceConfig) and src.auto_offset_reset == "earliest"
        for t in src.topics or []
    )


def _topics(cfg: ThalwegConfig, layout: LaneLayout, only: str | None) -> list[str]:
    if only is not None:
        return [only]
    configured = {t for s in cfg.sources for t in getattr(s, "topics", None) or []}
    return sorted(configured | set(layout.topics()))


def _broker_offsets(
    cfg: ThalwegConfig, only: str | None, report: Report
) -> dict[tuple[str, int], PartitionOffsets]:
    """Each Kafka topic's partitions' log start and end and the group's committed
    offset, now; a topic whose cluster does not answer is a warning in ``report``."""
    from thalweg.kafka.offsets import cluster_offsets

    found: dict[tuple[str, int], PartitionOffsets] = {}
    for src in cfg.sources:
        if not isinstance(src, KafkaSourceConfig):
            continue  # Pulsar's positions are message ids: no log offsets to compare
        for t in src.topics or []:
            if only is not None and t != only:
                continue
            try:
                offsets = asyncio.run(cluster_offsets(src, t))
            except ThalwegError as exc:
                report.add("warning", "broker_unreachable", t, str(exc))
                continue
            found.update({(t, p): off for p, off in offsets.items()})
    return found


def _check_broker(
    topics: list[str],
    committed: dict[tuple[str, int], PartitionOffsets],
    logs: dict[tuple[str, int], PartitionOffsets],
    lanes: dict[tuple[str, int], LaneAudit],
    summaries: dict[tuple[str, int], PartitionSummary],
    report: Report,
    earliest: frozenset[str] = frozenset(),
) -> None:
    """The lane against the cluster: nothing committed beyond the lane (the commit read
    before the lane), nothing in the lane the log never held (the log read after it: a
    broker that lost its data)."""
    for (t, p), off in sorted(committed.items()):
        if t not in topics:
            continue
        lane = lanes.get((t, p))
        summary = summaries.get((t, p))
        if lane is None or summary is None:
            if off.committed:
                report.add(
                    "error",
                    "commit_ahead",
                    f"{t}[{p}]",
                    f"the group committed {off.committed}, the lane holds nothing",
                )
            continue
        summary.committed = off.committed
        end = lane.coverage[-1][1] if lane.coverage else 0
        held = [b for _, b in lane.elsewhere]
        if off.committed is not None and off.committed > end and off.committed not in held:
            report.add(
                "error",
                "commit_ahead",
                f"{t}[{p}]",
                f"the group committed {off.committed}, the lane ends at {end}: "
                f"positions {end}-{off.committed - 1} were committed without being "
                "durable here (on a per-replica data_dir, verify a partition at "
                "its owner)",
            )
    for (t, p), log in sorted(logs.items()):
        lane = lanes.get((t, p))
        summary = summaries.get((t, p))
        if lane is None or summary is None:
            continue
        summary.log_start, summary.log_end = log.log_start, log.log_end
        end = lane.coverage[-1][1] if lane.coverage else 0
        if lane.origin is None and not lane.floor and log.log_start is not None and t in earliest:
            # No record of where the lane began (a lane older than that record, or a
            # bucket's): a source reading from the earliest began at the log's start.
            start_missing(
                lane.coverage,
                log.log_start,
                "the broker's log starts there and the source reads from the earliest; "
                "the lane keeps no origin record",
                lane.elsewhere,
                report,
                f"{t}[{p}]",
            )
        if log.log_end is not None and end > log.log_end + 1:
            report.add(
                "warning",
                "lane_ahead_of_log",
                f"{t}[{p}]",
                f"the lane ends at {end}, the broker's log at {log.log_end}: the "
                "broker lost records the lane holds (the gateway holds the "
                "partition until a new epoch: docs/operations.md)",
            )


def _check_unheld(
    topics: list[str],
    committed: dict[tuple[str, int], PartitionOffsets],
    lanes: dict[tuple[str, int], LaneAudit],
    report: Report,
    stopped: bool,
    earliest: frozenset[str],
) -> None:
    """Partitions the broker holds records for and the lane never held.

    The log as read *before* the lanes is what counts: records that arrived after the
    lanes were listed are not yet due. A group commit makes it ``commit_ahead``'s case;
    a source reading from the latest was never due the records before it began. Beside
    a running gateway a partition assigned moments ago holds nothing yet: a warning. So
    is a topic no partition of which has a lane (never ingested, nothing committed: the
    records are owed, as to a gateway not started yet). A partition skipped while the
    others of its topic were ingested is the blind spot: an error on a stopped lane."""
    ingested = {t for (t, _), lane in lanes.items() if lane.coverage}
    for (t, p), early in sorted(committed.items()):
        if t not in topics or early.committed:
            continue
        lane = lanes.get((t, p))
        if lane is not None and lane.coverage:
            continue
        start, end = early.log_start, early.log_end
        if start is None or end is None or end <= start or t not in earliest:
            continue
        if lane is not None and (lane.floor >= end or (lane.origin or 0) >= end):
            continue  # retention removed them, or the lane began after them
        said = (
            f"the broker holds offsets {start}-{end - 1}, the lane none of them and the "
            "group committed nothing"
        )
        if t not in ingested:
            # No partition of the topic was ever ingested and nothing was committed: the
            # records are owed, not lost (the next start reads them from the earliest).
            report.add(
                "warning",
                "partition_not_yet",
                f"{t}[{p}]",
                f"{said}: no partition of {t!r} has a lane yet (not ingested so far)",
            )
            continue
        report.add(
            "error" if stopped else "warning",
            "partition_missing" if stopped else "partition_not_yet",
            f"{t}[{p}]",
            said
            + (
                f" while other partitions of {t!r} have lanes (on a per-replica data_dir, "
                "verify a partition at its owner)"
                if stopped
                else ": a gateway is running and may have taken the partition moments ago"
            ),
        )


def _bucket_copy(cfg: ThalwegConfig, root: Path, only: str | None, report: Report) -> LaneLayout:
    """The bucket's lanes as readers resolve them, fetched into ``root``."""
    from thalweg.lane.remote.mirror import LaneMirror, resolve
    from thalweg.lane.remote.objectstore import ObjectStore

    layout = LaneLayout(root)
    store = ObjectStore(cfg.gateway.object_store)
    mirror = LaneMirror(layout, store)
    for t, partitions in sorted(mirror.partitions().items()):
        if only is not None and t != only:
            continue
        for p in sorted(partitions):
            raw = mirror.objects(Lane.RAW, t, p)
            kept = {(o.name, o.generation) for o in resolve(raw)}
            superseded = len(raw) - len(kept)
            if superseded:
                report.add(
                    "warning",
                    "superseded_objects",
                    f"{t}[{p}]",
                    f"{superseded} raw objects of older generations are still in the bucket "
                    "(a newer one holds their records; compaction at the owner removes them)",
                )
            names = {o.name for o in raw}
            for lane in (Lane.DECODED, Lane.DLQ):
                for o in mirror.objects(lane, t, p):
                    if o.name not in names:
                        report.add(
                            "warning",
                            "orphan_object",
                            f"{t}[{p}]",
                            f"{o.rel} has no raw object (written before a raw PUT that never "
                            "landed; nothing reads it, and the partition's owner sweeps it)",
                        )
            mirror.restore(t, p)
    for s in cfg.sinks:  # what each sink set aside, wherever it is fed (read-only)
        mirror.sync_refused(s.name, put=False)
    return layout
