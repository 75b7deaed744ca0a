"""The sinks of a configuration, each with its coverage store and feeder.

A sink below a node is fed through the node chain from the topic's decoded lane — or,
when a node on its chain is materialised, from the nearest such node's lane, running
only the nodes below it: a node read by several things is derived once
(``Dag.materialised_above``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
from datafusion import ScalarUDF

from thalweg.codecs.base import ArrowDecoder
from thalweg.config.models import ThalwegConfig
from thalweg.config.pipeline import upstream
from thalweg.errors import ConfigError
from thalweg.lane.layout import LaneLayout, Segment
from thalweg.lane.read.reader import LaneReader
from thalweg.lane.remote.mirror import LaneMirror
from thalweg.lane.writer import SegmentWriter
from thalweg.ops.health import Health
from thalweg.ops.metrics import Metrics
from thalweg.pipeline.dag import Chain, Dag, StageObserver
from thalweg.pipeline.quality import ContractStopError
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.coverage import CoverageStore
from thalweg.recovery.dead_letters import NodeDeadLetters
from thalweg.recovery.feeder import SinkFeeder
from thalweg.recovery.reading import Transform
from thalweg.recovery.table_docs import topic_docs
from thalweg.sidecars import SidecarClient, SidecarUnavailableError
from thalweg.sinks.base import Sink, SinkSchemaError, SinkStoppedError, SinkUnavailableError
from thalweg.sinks.loader import load_sink_class
from thalweg.sinks.node_lane import NodeLaneSink, node_lane_config, node_lane_schema


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
    observer: StageObserver | None = None,
    mirror: LaneMirror | None = None,
) -> list[SinkFeeder]:
    """One feeder per ``[[sinks]]`` table and per materialised node's lane
    (``node:<name>``), or only the one named ``only``; each holds its feeder lock.

    Raises:
        ConfigError: an unknown or unbuildable kind, a missing backend package, a sink
            that another process on this ``data_dir`` already feeds, or nothing named
            ``only``.
    """
    dag = Dag.of(cfg.pipeline)
    sinks: list[tuple[Any, Sink[Any], Transform | None, str | None]] = []
    for s in cfg.sinks:
        if only is None or s.name == only:
            leaf = next((n.name for n in dag.nodes if n.sink == s.name), None)
            above = dag.materialised_above(leaf, include_self=True) if leaf else None
            transform = node_transform(cfg, s.name, layout, columns, observer, metrics, above)
            sink = load_sink_class(s.kind)(s, cfg.gateway.data_dir, columns)
            sink.docs = topic_docs(cfg, s)  # what its tables say (the topics' contracts)
            sinks.append((s, sink, transform, above))
    for node in dag.nodes:
        if not dag.materialised(node.name):
            continue
        topic = dag.source_topic(node.name)
        lane = node_lane_config(node.name, topic, metadata=_metadata_below(cfg, dag, node.name))
        if only is None or lane.name == only:
            above = dag.materialised_above(node.name, include_self=False)
            transform = chain_transform(
                cfg, node.name, topic, lane.metadata, layout, columns, observer, metrics, above
            )
            sinks.append(
                (lane, NodeLaneSink(lane, cfg.gateway.data_dir, columns), transform, above)
            )
    if only is not None and not sinks:
        known = [s.name for s in cfg.sinks]
        known += [f"node:{n.name}" for n in dag.nodes if dag.materialised(n.name)]
        raise ConfigError(f"no sink named {only!r} (sinks: {', '.join(known) or 'none'})")
    feeders: list[SinkFeeder] = []
    try:
        for sink_cfg, sink, transform, above in sinks:
            store = CoverageStore(cfg.gateway.data_dir, sink_cfg.name)
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
                    transform=transform,
                    node=above,
                    mirror=mirror,
                )
            )
    except BaseException:
        for f in feeders:
            f.store.release()
        raise
    return feeders


def node_transform(
    cfg: ThalwegConfig,
    sink: str,
    layout: LaneLayout,
    columns: MetadataColumns,
    observer: StageObserver | None = None,
    metrics: Metrics | None = None,
    above: str | None = None,
) -> Transform | None:
    """For a sink attached to a node, the node chain as a function of a segment's rows
    (None for a sink of a topic's lane, or one reading its own node's lane as it is)."""
    node = next((n for n in cfg.pipeline.nodes if n.sink == sink), None)
    if node is None or above == node.name:
        return None
    sink_cfg = next(s for s in cfg.sinks if s.name == sink)
    return chain_transform(
        cfg,
        node.name,
        sink_cfg.topics[0],
        sink_cfg.read_metadata(),
        layout,
        columns,
        observer,
        metrics,
        above,
    )


def chain_transform(
    cfg: ThalwegConfig,
    node: str,
    topic: str,
    metadata: list[str],
    layout: LaneLayout,
    columns: MetadataColumns,
    observer: StageObserver | None = None,
    metrics: Metrics | None = None,
    above: str | None = None,
) -> Transform:
    """The chain from ``topic`` — or from below the materialised node ``above``, whose
    lane it then reads — down to ``node``, as a function of a segment's rows.

    Planned now against the input's schema when the lane read already has one (a query
    that does not plan is refused at start, naming the node); otherwise on the first
    rows. Records a node refuses (a runtime error of its SQL, a WebAssembly function
    out of fuel, a sidecar's error answer after its retries, a quarantining quality
    node's verdict) go to that node's dead-letter lane (``recovery.dead_letters``)
    before the rest is handed on, so they are covered without a row. A failure that is
    not about the rows — a schema the query no longer plans against, a sidecar's
    contract breach — degrades the sink (nothing of the batch lands), naming the node;
    a strict quality node's stop degrades it with reason ``contract``; a sidecar that
    is down makes it ``down`` (retried with backoff; the node's coverage does not
    advance).

    Raises:
        ConfigError: a query that does not plan, or a WebAssembly function that cannot
            load.
    """
    chain = Chain(
        Dag.of(cfg.pipeline),
        node,
        columns,
        sidecar_for=lambda n: SidecarClient(n, columns),
        udfs=configured_udfs(cfg),
        observer=observer,
        below=above,
    )
    if above is not None:
        lane_schema = node_lane_schema(cfg.gateway.data_dir, above, topic)
        if lane_schema is not None:
            chain.plan(lane_schema)
    else:
        schema = LaneReader(layout, columns).decoded_schema(topic)
        if schema is not None:
            raw = columns.raw_schema
            extra = [raw.field(columns.prefix + m) for m in metadata]
            fields = [f for f in schema if f.name != columns.decode_error]
            fields += [f for f in extra if f.name not in schema.names]
            chain.plan(pa.schema(fields))

    dead = NodeDeadLetters(layout, [n.name for n in chain.nodes], columns, metrics)

    def transform(rows: pa.Table, topic: str, partition: int, seg: Segment) -> pa.Table:
        try:
            derived = chain.apply(rows)
            dead.record(topic, partition, seg, derived.rejected)
            return derived.rows
        except ContractStopError as exc:  # a strict quality node: stop, nothing skipped
            raise SinkStoppedError(str(exc)) from exc
        except SidecarUnavailableError as exc:  # the sink is down while its sidecar is
            raise SinkUnavailableError(str(exc), retry_after_s=exc.retry_after_s) from exc
        except ConfigError as exc:
            raise SinkSchemaError(str(exc)) from exc
        except Exception as exc:  # DataFusion's errors on rows
            raise SinkSchemaError(f"pipeline.nodes.{node}: {exc}") from exc

    return transform


def _metadata_below(cfg: ThalwegConfig, dag: Dag, node: str) -> list[str]:
    """The raw metadata columns the sinks fed through ``node``'s lane ask for: its lane
    keeps them, since those sinks read it rather than the raw lane."""
    wanted: set[str] = set()
    by_name = dag.by_name
    for s in cfg.sinks:
        feeding = next((n.name for n in dag.nodes if n.sink == s.name), None)
        if feeding is not None and node in upstream(by_name, feeding):
            wanted.update(s.read_metadata())
    return sorted(wanted)


def configured_udfs(cfg: ThalwegConfig) -> list[ScalarUDF]:
    """The configured WebAssembly functions (wasmtime imported only when there are any).

    Raises:
        ConfigError: wasmtime is not installed, or a module cannot run as configured.
    """
    if not cfg.pipeline.udfs:
        return []
    try:
        from thalweg.pipeline.udf import load_udfs
    except ImportError as exc:
        raise ConfigError(
            f"pipeline.udfs need a package that is not installed ({exc.name}): "
            "pip install 'thalweg[wasm]'"
        ) from exc
    return [u.udf for u in load_udfs(cfg.pipeline.udfs)]
