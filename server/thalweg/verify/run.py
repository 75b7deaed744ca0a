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

from thalweg.config.models import KafkaSourceConfig, ThalwegConfig
from thalweg.errors import ConfigError, ThalwegError
from thalweg.lane.layout import Lane, LaneLayout
from thalweg.records.columns import MetadataColumns
from thalweg.verify.lanes import LaneAudit, audit_partition
from thalweg.verify.report import PartitionSummary, Report
from thalweg.verify.sinks import audit_sink


def verify(
    cfg: ThalwegConfig,
    *,
    topic: str | None = None,
    sink: str | None = None,
    broker: bool = True,
) -> Report:
    """Check everything the configuration names (or only ``topic`` / ``sink``)."""
    report = Report()
    columns = MetadataColumns(cfg.gateway.metadata_prefix)
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
                lanes[(t, p)] = audit_partition(layout, columns, t, p, report)
        summaries = {
            key: PartitionSummary(a.topic, a.partition, a.epoch, a.coverage, a.rows, a.floor)
            for key, a in lanes.items()
        }
        if broker:
            _check_broker(cfg, topics, lanes, summaries, report)
        report.partitions = [summaries[k] for k in sorted(summaries)]
        for s in cfg.sinks:
            if (sink is None or s.name == sink) and (topic is None or topic in s.topics):
                audit_sink(cfg, s.name, columns, lanes, report)
    return report


def _topics(cfg: ThalwegConfig, layout: LaneLayout, only: str | None) -> list[str]:
    if only is not None:
        return [only]
    configured = {t for s in cfg.sources for t in getattr(s, "topics", None) or []}
    return sorted(configured | set(layout.topics()))


def _check_broker(
    cfg: ThalwegConfig,
    topics: list[str],
    lanes: dict[tuple[str, int], LaneAudit],
    summaries: dict[tuple[str, int], PartitionSummary],
    report: Report,
) -> None:
    """The lane against the cluster: nothing committed beyond the lane, nothing in the
    lane the log never held (a broker that lost its data)."""
    from thalweg.kafka.offsets import cluster_offsets

    for src in cfg.sources:
        if not isinstance(src, KafkaSourceConfig):
            continue  # Pulsar's positions are message ids: no log offsets to compare
        for t in [t for t in src.topics if t in topics]:
            try:
                offsets = asyncio.run(cluster_offsets(src, t))
            except ThalwegError as exc:
                report.add("warning", "broker_unreachable", t, str(exc))
                continue
            for p, off in offsets.items():
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
                summary.log_start, summary.log_end = off.log_start, off.log_end
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
                if off.log_end is not None and end > off.log_end + 1:
                    report.add(
                        "warning",
                        "lane_ahead_of_log",
                        f"{t}[{p}]",
                        f"the lane ends at {end}, the broker's log at {off.log_end}: the "
                        "broker lost records the lane holds (the gateway holds the "
                        "partition until a new epoch: docs/operations.md)",
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
    return layout
