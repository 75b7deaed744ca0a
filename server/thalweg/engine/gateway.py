"""The running gateway: lanes, sources, Flight and admin servers, under one stop event.

Its length: it is the composition root, wiring every part once (one source's machinery
is ``engine/ingest/``, the lanes' upkeep ``engine/jobs/``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from thalweg.codecs.base import ArrowDecoder
from thalweg.config.checks import data_dir_error, listen_problem
from thalweg.config.models import (
    ArrowIpcSourceConfig,
    FlightSourceConfig,
    SourceConfig,
    ThalwegConfig,
)
from thalweg.engine.context import RAW_LANE, LaneContext
from thalweg.engine.ingest.lag_gate import LagGate
from thalweg.engine.ingest.runner import SourceRunner
from thalweg.engine.jobs.compaction import CompactionJob
from thalweg.engine.jobs.lane_sync import LaneSync
from thalweg.engine.jobs.retention import RetentionJob
from thalweg.engine.preflight import preflight
from thalweg.errors import ConfigError, LaneError, ShutdownTimeoutError
from thalweg.flight.errors import clean
from thalweg.flight.server import GatewayFlightServer
from thalweg.group.owners import OwnerDirectory
from thalweg.lane.layout import LaneLayout
from thalweg.lane.liveness import hold_running
from thalweg.lane.read.cache import SegmentCache
from thalweg.lane.read.catalog import Ingesting, LaneCatalog
from thalweg.lane.read.ipc_copies import IpcCopies
from thalweg.lane.read.live import LiveTail
from thalweg.lane.remote.mirror import LaneMirror
from thalweg.lane.remote.objectstore import ObjectStore
from thalweg.lane.writer import SegmentWriter
from thalweg.ops.health import Health, State
from thalweg.ops.http import AdminServer
from thalweg.ops.metrics import Metrics
from thalweg.ops.stats import PipelineStats
from thalweg.ops.tracing import Tracing
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders
from thalweg.recovery.views import NodeViews

log = logging.getLogger(__name__)

# Python's default GC (700 allocations) runs constantly while Arrow arrays are built from
# millions of Python objects; PERFORMANCE-NOTES measured ingest roughly doubling with a
# higher first-generation threshold and start-up objects frozen. See ADR 0004.
GC_THRESHOLDS = (100_000, 50, 100)


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class _NodeObserver:
    """Pipeline nodes' work into /stats (stage ``node:<name>``, stalled when rows wait
    and nothing finishes) and /metrics (``twg_node_queue_depth``, ``twg_node_rows``)."""

    def __init__(self, stats: PipelineStats, metrics: Metrics) -> None:
        self._stats = stats
        self._metrics = metrics

    def queued(self, stage: str, depth: int) -> None:
        self._stats.queued(stage, depth)
        self._metrics.node_queue_depth.labels(stage.removeprefix("node:")).set(depth)

    def done(self, stage: str, records: int, nbytes: int, seconds: float) -> None:
        self._stats.done(stage, records, nbytes, seconds)
        self._metrics.node_rows.labels(stage.removeprefix("node:")).inc(records)


def _object_store_mirror(cfg: ThalwegConfig, layout: LaneLayout) -> LaneMirror | None:
    """The object store holding the lanes, checked reachable and its retention floors
    taken before anything is served (None: local lanes).

    Raises:
        ConfigError: the bucket does not answer.
    """
    g = cfg.gateway
    if not g.lanes_in_object_store:
        return None
    mirror = LaneMirror(
        layout, ObjectStore(g.object_store), orphan_age_s=g.object_store.orphan_age_s
    )
    try:
        mirror.sync_floors()
    except LaneError as exc:
        raise ConfigError(f"gateway.data_dir: the object store does not answer: {exc}") from exc
    return mirror


def _with_state_dir(source: SourceConfig, data_dir: Path) -> SourceConfig:
    """An ``arrow_ipc`` or ``flight`` source keeps its state in the gateway's data_dir
    unless told."""
    if isinstance(source, (ArrowIpcSourceConfig, FlightSourceConfig)) and source.state_dir is None:
        return source.model_copy(update={"state_dir": data_dir / "sources" / source.name})
    return source


def awaiting(task: asyncio.Task[None]) -> str:
    """The chain of awaits a task is suspended in, innermost last (``file:line name``)."""
    out: list[str] = []
    coro: Any = task.get_coro()
    while coro is not None and len(out) < 16:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        name = frame.f_code.co_filename.rsplit("/", 1)[-1]
        out.append(f"{name}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " > ".join(out) or "?"


class _GatewayIngesting(Ingesting):
    """What the read side hears from this gateway's runners, configuration, group and
    lane sync (``lane.read.catalog.Ingesting``)."""

    def __init__(self, gateway: Gateway) -> None:
        self._g = gateway

    def payload_schema(self, topic: str) -> pa.Schema | None:
        for r in self._g.runners:
            schema = r.payload_schema(topic)
            if schema is not None:
                return schema
        return None

    def decoded_topics(self) -> set[str]:
        return set().union(*(r.decoded_topics() for r in self._g.runners))

    def configured_topics(self) -> list[str]:
        return [t for s in self._g.cfg.sources for t in s.topics]

    def configured_sinks(self) -> list[str]:
        return [s.name for s in self._g.cfg.sinks]

    def group_partitions(self, topic: str) -> list[int]:
        return self._g.owners.partitions(topic)

    def awaiting_assignment(self, topic: str) -> bool:
        return self._g.owners.awaiting(topic)

    def read_through(self, topic: str) -> None:
        if self._g.sync is not None:
            self._g.sync.warm(topic)


class Gateway:
    """Everything ``twg stream`` runs, startable in-process (tests, quickstart).

    Raises:
        ConfigError: the host cannot run this configuration — ``data_dir`` not writable,
            a listen address in use or not this host's — in one line naming the setting.
    """

    def __init__(self, cfg: ThalwegConfig) -> None:
        self.cfg = cfg
        g = cfg.gateway
        self.columns = MetadataColumns(g.metadata_prefix)
        preflight(cfg).raise_first()  # what `twg config validate` reports, the same way
        self.layout = LaneLayout(g.data_dir)
        try:
            self.layout.claim(g.metadata_prefix)
            # Held until run() ends: twg verify tells a stopped gateway by it.
            self._running_fd: int | None = hold_running(self.layout.root)
        except OSError as exc:
            raise ConfigError(data_dir_error(g.data_dir, exc)) from exc
        self.metrics = Metrics()
        self.health = Health()
        self.live = LiveTail()
        self.mirror = _object_store_mirror(cfg, self.layout)
        self.owners = OwnerDirectory(
            shared_lane=g.shared_data_dir or self.mirror is not None,
            on_publish=self._gauge_owners,
        )
        copies = IpcCopies(self.layout.root, g.flight.ipc_copy_bytes)
        self.segment_cache = SegmentCache(g.flight.segment_cache_bytes, copies)
        cache = self.segment_cache
        self.metrics.watch_segment_cache(
            lambda: (cache.nbytes, cache.hits, cache.misses), lambda: (copies.nbytes, copies.hits)
        )
        t = g.tracing
        self.tracing = Tracing(t.otlp_endpoint, t.service_name, t.sample_ratio)
        self.stats = PipelineStats(
            stall_after_s=g.stall_after_s,
            on_done=lambda stage, n: self.metrics.stage_records.labels(stage).inc(n),
        )
        self.health.register(RAW_LANE, "raw_lane", gates_readiness=True)
        self.health.register("flight", "flight", gates_readiness=False)
        limit = cfg.recovery.max_lag_records
        # Backpressure through the DAG: only where the feeders run beside the sources.
        self.gate = LagGate([], limit) if limit is not None and g.role == "both" else None
        ctx = LaneContext(
            layout=self.layout,
            writer=SegmentWriter(self.layout, self.columns, cfg.raw_lane, self.segment_cache),
            columns=self.columns,
            live=self.live,
            metrics=self.metrics,
            health=self.health,
            raw_cfg=cfg.raw_lane,
            stats=self.stats,
            tracing=self.tracing,
            gate=self.gate,
            owners=self.owners,
            mirror=self.mirror,
        )
        ingest, feed = g.role in ("ingest", "both"), g.role in ("recovery", "both")
        # Files sources are read by ``twg batch``; their lanes are served all the same.
        streamed = [_with_state_dir(s, g.data_dir) for s in cfg.sources if s.kind != "files"]
        self.runners = [SourceRunner(s, ctx) for s in streamed] if ingest else []
        # Secondary sinks read the durable lanes, never the fetch path (recovery/feeder).
        self.feeders = (
            build_feeders(
                cfg,
                self.layout,
                self.columns,
                metrics=self.metrics,
                health=self.health,
                decoder_for=self._decoder,
                writer=ctx.writer,
                observer=_NodeObserver(self.stats, self.metrics),
                mirror=self.mirror,
            )
            if feed
            else []
        )
        if self.gate is not None:
            self.gate.feeders = self.feeders
        # Lanes in an object store: every replica's copy of what other members wrote
        # (engine/jobs/lane_sync.py), also asked for a topic a read finds cold.
        self.sync = (
            LaneSync(
                self.mirror,
                self._configured_topics,
                self._owned,
                self.owners,
                g.object_store.sync_interval_s,
                sinks=lambda: [s.name for s in cfg.sinks],
            )
            if self.mirror is not None
            else None
        )
        self.catalog = LaneCatalog(
            self.layout,
            self.columns,
            self.live,
            cache=self.segment_cache,
            ingesting=_GatewayIngesting(self),
            retention_grace_s=cfg.retention.grace_s,
        )
        if self.sync is not None:
            self.sync.synced = self.catalog.refresh
        self._probe_lane()
        self.flight = self._start_flight(cfg)
        self.owners.location = self.flight.url  # what this member announces to the group
        self.health.set("flight", State.UP, self.flight.url)
        host, _, port = g.http_listen.rpartition(":")
        try:
            self.admin = AdminServer(
                host,
                int(port),
                self.health,
                self.metrics,
                self.stats,
                metrics_enabled=g.metrics_enabled,
                group=self.owners.snapshot,
            )
        except OSError as exc:
            self.flight.shutdown()
            problem = listen_problem("gateway.http_listen", g.http_listen)
            raise ConfigError(
                problem or f"gateway.http_listen: cannot listen on {g.http_listen}: {exc}"
            ) from exc

    def _start_flight(self, cfg: ThalwegConfig) -> GatewayFlightServer:
        """The Flight server, listening; a port in use is found before gRPC tries it
        (gRPC itself only says "Server did not start properly", on stderr too)."""
        g = cfg.gateway
        problem = listen_problem("gateway.flight_listen", g.flight_listen)
        if problem is not None:
            raise ConfigError(problem)
        try:
            return GatewayFlightServer(
                g.flight_listen,
                self.catalog,
                self.metrics,
                advertise=g.flight_advertise,
                sources={t: s for s in cfg.broker_sources() for t in s.topics},
                pattern_sources=[s for s in cfg.broker_sources() if s.topic_pattern],
                health=self.health.tree,
                auth=g.auth,
                tls=g.tls,
                serving=g.flight,
                idempotent_producer=g.idempotent_producer,
                tracing=self.tracing,
                put_timeout_ms=g.put_timeout_ms,
                nodes=NodeViews(cfg, self.layout, self.columns) if cfg.pipeline.nodes else None,
                owners=self.owners,
            )
        except (pa.ArrowException, OSError) as exc:
            why = clean(str(exc)).split(". Detail:", 1)[0]
            setting = "gateway.tls" if g.tls is not None else "gateway.flight_listen"
            problem = listen_problem("gateway.flight_listen", g.flight_listen)
            raise ConfigError(
                problem or f"{setting}: the Flight server did not start on {g.flight_listen}: {why}"
            ) from exc

    @property
    def flight_url(self) -> str:
        return str(self.flight.url)

    @property
    def admin_url(self) -> str:
        return self.admin.url

    def _gauge_owners(self, owners: OwnerDirectory) -> None:
        """``twg_partition_owned``: 1 for this gateway's partitions, 0 for the others'."""
        for topic, parts in owners.owners().items():
            for p, location in parts.items():
                mine = location is None or location == owners.location
                self.metrics.owned.labels(topic, str(p)).set(1 if mine else 0)

    def _generation(self, topic: str) -> int:
        """The ownership generation of the source ingesting ``topic`` (object names)."""
        for r in self.runners:
            if r.cfg.takes(topic):
                return r.source.generation()
        return 0

    def _owned(self) -> list[tuple[str, int]]:
        """The partitions this gateway ingests now."""
        return [key for r in self.runners for key in list(r.state.parts)]

    def _decoder(self, topic: str) -> ArrowDecoder | None:
        for r in self.runners:
            decoder = r.decoders.get(topic)
            if decoder is not None:
                return decoder
        return None

    def _configured_topics(self) -> list[str]:
        return [t for s in self.cfg.sources for t in s.topics]

    def _probe_lane(self) -> None:
        """The raw lane is ready once its root is writable (a lane written before and
        now read-only is found here, at start); writes keep it honest after."""
        probe = self.layout.root / "raw" / f".probe-{os.getpid()}"  # several roles, one dir
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(data_dir_error(self.cfg.gateway.data_dir, exc)) from exc
        self.health.set(RAW_LANE, State.UP, "writable")

    async def run(self, stop: asyncio.Event) -> None:
        """Serve and ingest until ``stop`` is set; then drain, commit and close."""
        if self.cfg.gateway.gc_tuning:
            tune_gc()
        self.admin.start()
        log.info("flight at %s, admin at %s", self.flight_url, self.admin_url)

        async def beat() -> None:
            while not stop.is_set():
                self.health.beat()
                await asyncio.sleep(1.0)

        tasks = [asyncio.create_task(r.run(stop), name=r.component) for r in self.runners]
        tasks += [asyncio.create_task(f.run(stop), name=f.component) for f in self.feeders]
        if self.gate is not None:
            tasks.append(asyncio.create_task(self.gate.run(stop)))
        if self.cfg.compaction.enabled and self.runners:  # only the owner merges
            compaction = CompactionJob(
                self.cfg,
                self.layout,
                self.metrics,
                self._owned,
                mirror=self.mirror,
                generation=self._generation,
            )
            tasks.append(asyncio.create_task(compaction.run(stop)))
        if self.cfg.retention.enabled and self.runners:  # the lanes' writer keeps them
            job = RetentionJob(
                self.cfg, self.layout, self.metrics, mirror=self.mirror, owned=self._owned
            )
            tasks.append(asyncio.create_task(job.run(stop)))
        if self.sync is not None:
            tasks.append(asyncio.create_task(self.sync.run(stop)))
        tasks.append(asyncio.create_task(beat()))
        stopped = asyncio.create_task(stop.wait())
        failure: BaseException | None = None
        try:
            while failure is None and not stop.is_set():
                done, _ = await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
                failure = next(
                    (t.exception() for t in done if t is not stopped and t.exception() is not None),
                    None,
                )
                if all(t.done() for t in tasks):
                    break
        finally:
            stop.set()
            timed_out = await self._drain(tasks, stopped)
            self.flight.shutdown()
            self.admin.stop()
            self.tracing.shutdown()
            self._let_go_of_the_lane()
        if failure is not None:
            raise failure
        if timed_out:
            raise ShutdownTimeoutError(
                f"shutdown took longer than gateway.shutdown_timeout_s "
                f"({self.cfg.gateway.shutdown_timeout_s:g}s); what was not yet durable was "
                "not committed and is read again after the restart"
            )

    def _let_go_of_the_lane(self) -> None:
        """Release the lane's running lock (lane/liveness.py): nothing writes it now."""
        if self._running_fd is not None:
            os.close(self._running_fd)
            self._running_fd = None

    async def _drain(self, tasks: list[asyncio.Task[None]], stopped: asyncio.Task[bool]) -> bool:
        """Let the runners flush, commit and leave their groups within the deadline;
        cancel what is left after it. True when the deadline passed.

        Cancelling is safe: a commit only ever follows a durable write, so an interrupted
        flush leaves its records uncommitted, to be read again, never lost.
        """
        stopped.cancel()
        deadline = self.cfg.gateway.shutdown_timeout_s
        _, pending = await asyncio.wait(tasks, timeout=deadline)
        for t in pending:
            # Where it waited: the first thing to read when a stop runs past its deadline.
            log.error("shutdown: %s still running, cancelled; at %s", t.get_name(), awaiting(t))
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if pending:
            log.error("shutdown deadline of %gs passed; %d tasks cancelled", deadline, len(pending))
        return bool(pending)
