"""The sinks of a configuration, each with its coverage store and feeder."""

from __future__ import annotations

from collections.abc import Callable

from thalweg.codecs.base import ArrowDecoder
from thalweg.config.models import ThalwegConfig
from thalweg.lane.layout import LaneLayout
from thalweg.lane.writer import SegmentWriter
from thalweg.ops.health import Health
from thalweg.ops.metrics import Metrics
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.coverage import CoverageStore
from thalweg.recovery.feeder import SinkFeeder
from thalweg.sinks.loader import load_sink_class


def build_feeders(
    cfg: ThalwegConfig,
    layout: LaneLayout,
    columns: MetadataColumns,
    *,
    metrics: Metrics | None = None,
    health: Health | None = None,
    decoder_for: Callable[[str], ArrowDecoder | None] | None = None,
    writer: SegmentWriter | None = None,
    only: str | None = None,
) -> list[SinkFeeder]:
    """One feeder per ``[[sinks]]`` table (or only the one named ``only``), each holding
    its sink's feeder lock.

    Raises:
        ConfigError: an unknown or unbuildable kind, a missing backend package, a sink
            that another process on this ``data_dir`` already feeds, or no sink ``only``.
    """
    from thalweg.errors import ConfigError

    chosen = [s for s in cfg.sinks if only is None or s.name == only]
    if only is not None and not chosen:
        known = ", ".join(s.name for s in cfg.sinks) or "none configured"
        raise ConfigError(f"no sink named {only!r} (sinks: {known})")
    feeders: list[SinkFeeder] = []
    try:
        for s in chosen:
            sink = load_sink_class(s.kind)(s, cfg.gateway.data_dir)
            store = CoverageStore(cfg.gateway.data_dir, s.name)
            store.claim()
            feeders.append(
                SinkFeeder(
                    sink,
                    store,
                    layout,
                    columns,
                    cfg.recovery,
                    metrics=metrics,
                    health=health,
                    decoder_for=decoder_for,
                    writer=writer,
                )
            )
    except BaseException:
        for f in feeders:
            f.store.release()
        raise
    return feeders
