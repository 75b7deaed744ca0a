"""The sinks of a configuration, each with its coverage store and feeder."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
from datafusion import ScalarUDF

from thalweg.codecs.base import ArrowDecoder
from thalweg.config.models import ThalwegConfig
from thalweg.errors import ConfigError
from thalweg.lane.layout import LaneLayout
from thalweg.lane.reader import LaneReader
from thalweg.lane.writer import SegmentWriter
from thalweg.ops.health import Health
from thalweg.ops.metrics import Metrics
from thalweg.pipeline.dag import Chain, Dag, StageObserver
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.coverage import CoverageStore
from thalweg.recovery.feeder import SinkFeeder
from thalweg.sidecars import SidecarClient, SidecarUnavailableError
from thalweg.sinks.base import SinkSchemaError, SinkUnavailableError
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
    observer: StageObserver | None = None,
) -> list[SinkFeeder]:
    """One feeder per ``[[sinks]]`` table (or only the one named ``only``), each holding
    its sink's feeder lock.

    Raises:
        ConfigError: an unknown or unbuildable kind, a missing backend package, a sink
            that another process on this ``data_dir`` already feeds, or no sink ``only``.
    """
    chosen = [s for s in cfg.sinks if only is None or s.name == only]
    if only is not None and not chosen:
        known = ", ".join(s.name for s in cfg.sinks) or "none configured"
        raise ConfigError(f"no sink named {only!r} (sinks: {known})")
    feeders: list[SinkFeeder] = []
    try:
        for s in chosen:
            transform = node_transform(cfg, s.name, layout, columns, observer)
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
                    transform=transform,
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
) -> Callable[[pa.Table], pa.Table] | None:
    """For a sink attached to a node, the node chain as a function of a segment's rows
    (None for a sink of a topic's lane).

    Planned now against the topic's decoded schema when the lane already has one (a
    query that does not plan is refused at start, naming the node); otherwise on the
    first rows. A failure on rows (a schema the query no longer plans against, a runtime
    error of the SQL) degrades the sink — nothing of the batch lands — naming the node.

    A sidecar that is down makes the sink ``down`` (retried with backoff; the node's
    coverage does not advance); one that breaks the contract makes it ``degraded``.

    Raises:
        ConfigError: a query that does not plan.
    """
    node = next((n for n in cfg.pipeline.nodes if n.sink == sink), None)
    if node is None:
        return None
    chain = Chain(
        Dag.of(cfg.pipeline),
        node.name,
        columns,
        sidecar_for=lambda n: SidecarClient(n, columns),
        udfs=_udfs(cfg),
        observer=observer,
    )
    sink_cfg = next(s for s in cfg.sinks if s.name == sink)
    schema = LaneReader(layout, columns).decoded_schema(sink_cfg.topics[0])
    if schema is not None:
        raw = columns.raw_schema
        extra = [raw.field(columns.prefix + m) for m in sink_cfg.metadata]
        fields = [f for f in schema if f.name != columns.decode_error]
        fields += [f for f in extra if f.name not in schema.names]
        chain.plan(pa.schema(fields))

    def transform(rows: pa.Table) -> pa.Table:
        try:
            return chain.apply(rows)
        except SidecarUnavailableError as exc:  # the sink is down while its sidecar is
            raise SinkUnavailableError(str(exc)) from exc
        except ConfigError as exc:
            raise SinkSchemaError(str(exc)) from exc
        except Exception as exc:  # DataFusion's errors on rows
            raise SinkSchemaError(f"pipeline.nodes.{node.name}: {exc}") from exc

    return transform


def _udfs(cfg: ThalwegConfig) -> list[ScalarUDF]:
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
