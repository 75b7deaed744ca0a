"""``twg batch``: files through the stream's own pipeline, once, then a summary.

The run is a :class:`~thalweg.engine.ingest.runner.SourceRunner` over a
:class:`~thalweg.sources.files.source.FileSource` — the same partitions, checkpoint,
decoders, contract and dead-letter lane as ``twg stream`` — without Flight or the admin
server. When every file has been read, the runner drains (everything buffered becomes
durable and is committed to the manifest), and then each sink fed from the lane topic
gets one recovery pass (``recovery/feeder.py``), so sinks and pipeline nodes see the
files' rows exactly as they would a topic's.

``dry_run`` reads every file and decodes it through the same decoders and contract,
counting what would fail, and writes nothing: no lane, no manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from thalweg.config.models import FilesSourceConfig, SourceConfig, ThalwegConfig
from thalweg.engine.context import RAW_LANE, LaneContext, new_backoff
from thalweg.engine.gateway import tune_gc
from thalweg.engine.ingest.runner import SourceRunner
from thalweg.errors import ConfigError, InvariantError
from thalweg.lane.layout import LaneLayout
from thalweg.lane.liveness import hold_running
from thalweg.lane.read.live import LiveTail
from thalweg.lane.writer import SegmentWriter
from thalweg.ops.health import Health
from thalweg.ops.metrics import Metrics
from thalweg.ops.stats import PipelineStats
from thalweg.pipeline.decode import decode_batch
from thalweg.pipeline.decoders import TopicDecoders
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders
from thalweg.sources.files.dry_read import DryRead
from thalweg.sources.files.source import FileSource, Progress, resolve_inputs

log = logging.getLogger(__name__)

ProgressHook = Callable[[Progress], None]


@dataclass(slots=True)
class BatchSummary:
    """What a run did (``--output json`` prints it as is)."""

    topic: str
    dry_run: bool
    files: int
    files_done: int
    files_skipped: int
    files_failed: int
    rows: int
    bytes: int
    dead_letters: int
    dead_letter_reasons: dict[str, int]
    seconds: float
    errors: list[dict[str, str]] = field(default_factory=list)
    sinks: dict[str, dict[str, object]] = field(default_factory=dict)
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        """Every file was read to its end (dead-lettered rows are not errors)."""
        return not self.errors and not self.interrupted

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self), "rows_per_s": round(self.rows_per_s, 1)}


def files_source(
    cfg: ThalwegConfig, name: str | None, topic: str | None, paths: list[str]
) -> FilesSourceConfig:
    """The files source a run reads with: the one named (a broker source lends its topic,
    contract and schema limits), or the configuration's only files source, or its only
    source; ``topic`` and ``paths`` (when given) override its own.

    Raises:
        ConfigError: no such source, an ambiguous choice, or no files to read.
    """
    if name is not None:
        base = next((s for s in cfg.sources if s.name == name), None)
        if base is None:
            raise ConfigError(f"--source {name!r}: no source of that name in the configuration")
    else:
        files = [s for s in cfg.sources if isinstance(s, FilesSourceConfig)]
        candidates: list[SourceConfig] = [*files] or list(cfg.sources)
        if len(candidates) != 1:
            names = ", ".join(s.name for s in candidates)
            raise ConfigError(f"several sources ({names}): name one with --source")
        base = candidates[0]
    if isinstance(base, FilesSourceConfig):
        src = base
    else:
        src = FilesSourceConfig(
            kind="files",
            name=base.name,
            topics=base.topics[:1] or ["files"],
            cluster=base.cluster,
            contract=base.contract,
            schema_limits=base.schema_limits,
        )
    lane_topic = topic or src.topics[0]
    update: dict[str, Any] = {"topics": [lane_topic], "paths": paths or src.paths}
    if src.state_dir is None:
        update["state_dir"] = Path(cfg.gateway.data_dir) / "batch" / lane_topic
    out = src.model_copy(update=update)
    if not out.paths:
        raise ConfigError("no files to read: name them on the command line or in paths = [...]")
    resolve_inputs(out.paths)  # a name that matches nothing is refused before anything is written
    return out


class BatchRun:
    """One ``twg batch`` run (see the module docstring).

    Args:
        cfg: the configuration (its gateway.data_dir holds the lanes and the manifest).
        source: the files source, from :func:`files_source`.
        on_progress: called about once a second with the progress so far.
    """

    def __init__(
        self,
        cfg: ThalwegConfig,
        source: FilesSourceConfig,
        on_progress: ProgressHook | None = None,
    ) -> None:
        self.cfg = cfg
        self.source_cfg = source
        self.topic = source.topics[0]
        self.columns = MetadataColumns(cfg.gateway.metadata_prefix)
        self.on_progress = on_progress
        self.metrics = Metrics()
        self.dead_letters: Counter[tuple[str, str]] = Counter()  # (topic, reason) → records
        self.health = Health()
        self.health.register(RAW_LANE, "raw_lane", gates_readiness=True)

    # -- a real run ------------------------------------------------------------------

    async def run(self, interrupt: asyncio.Event | None = None) -> BatchSummary:
        """Read, decode and make durable every file; feed the topic's sinks; summarise.

        ``interrupt`` (SIGINT/SIGTERM) stops reading: what was read is made durable and
        committed, the sinks are not fed, and a re-run resumes after the last durable row.

        Raises:
            ConfigError: the data_dir cannot be used, or the lane topic holds partitions
                this manifest does not know (a stream's topic).
        """
        g = self.cfg.gateway
        layout = LaneLayout(g.data_dir)
        try:
            layout.claim(g.metadata_prefix)
            running = hold_running(layout.root)  # twg verify tells a finished run by it
        except OSError as exc:
            raise ConfigError(f"gateway.data_dir {g.data_dir}: {exc}") from exc
        try:
            return await self._run(layout, interrupt)
        finally:
            os.close(running)

    async def _run(self, layout: LaneLayout, interrupt: asyncio.Event | None) -> BatchSummary:
        g = self.cfg.gateway
        if g.gc_tuning:
            tune_gc()
        stats = PipelineStats(stall_after_s=g.stall_after_s)
        ctx = LaneContext(
            layout=layout,
            writer=SegmentWriter(layout, self.columns, self.cfg.raw_lane, None),
            columns=self.columns,
            live=LiveTail(),
            metrics=self.metrics,
            health=self.health,
            raw_cfg=self.cfg.raw_lane,
            stats=stats,
            dead_letters=self.dead_letters,
        )
        runner = SourceRunner(self.source_cfg, ctx)
        source = runner.source
        if not isinstance(source, FileSource):
            raise InvariantError("source is not a FileSource")
        lane_parts = layout.partitions(self.topic)
        known = {e.partition for e in source.manifest.entries}
        strangers = sorted(set(lane_parts) - known)
        if strangers:
            raise ConfigError(
                f"topic {self.topic!r}'s lane holds partitions {strangers} that no file of its "
                "batch manifest owns (a stream's topic?); batch into another topic (--topic)"
            )
        source.lane_partitions = lane_parts
        started = time.monotonic()
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        reporter = asyncio.create_task(self._report(source.progress, stop))
        try:
            waits = [asyncio.create_task(source.finished.wait())]
            if interrupt is not None:
                waits.append(asyncio.create_task(interrupt.wait()))
            await asyncio.wait([task, *waits], return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            stop.set()
            await task  # drains: everything read is durable and committed, or it raises
        finally:
            stop.set()
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        await source.settle()
        interrupted = interrupt is not None and interrupt.is_set()
        sinks = {} if interrupted else await self._feed(layout)
        if self.on_progress is not None:
            self.on_progress(source.progress)
        summary = self._summary(source.progress, time.monotonic() - started, sinks)
        summary.interrupted = interrupted
        return summary

    async def _report(self, progress: Progress, stop: asyncio.Event) -> None:
        while not stop.is_set() and self.on_progress is not None:
            self.on_progress(progress)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async def _feed(self, layout: LaneLayout) -> dict[str, dict[str, object]]:
        """One pass of every sink (and materialised node) fed from the lane topic."""
        out: dict[str, dict[str, object]] = {}
        for sink in self.cfg.sinks:
            if self.topic not in sink.topics:
                continue
            try:
                [feeder] = build_feeders(
                    self.cfg, layout, self.columns, metrics=self.metrics, only=sink.name
                )
            except ConfigError as exc:  # a gateway feeds it now: it will catch up itself
                log.warning("sink %s not fed by this run: %s", sink.name, exc)
                out[sink.name] = {"fed": False, "reason": str(exc)}
                continue
            try:
                await feeder.open()
                summary = await feeder.pass_once(topic=self.topic, final=True)
            finally:
                await feeder.close()
            out[sink.name] = summary.as_dict()
        return out

    def _summary(
        self, p: Progress, seconds: float, sinks: dict[str, dict[str, object]]
    ) -> BatchSummary:
        reasons = Counter(
            {reason: n for (topic, reason), n in self.dead_letters.items() if topic == self.topic}
        )
        return BatchSummary(
            topic=self.topic,
            dry_run=False,
            files=p.files_total,
            files_done=p.files_done,
            files_skipped=p.files_skipped,
            files_failed=p.files_failed,
            rows=p.rows,
            bytes=p.bytes_read,
            dead_letters=sum(reasons.values()),
            dead_letter_reasons=dict(reasons),
            seconds=round(seconds, 3),
            errors=p.errors,
            sinks=sinks,
        )

    # -- a dry run -------------------------------------------------------------------

    async def dry_run(self) -> BatchSummary:
        """Read and decode every file, count what would fail, write nothing."""
        return await asyncio.to_thread(self._dry_run)

    def _dry_run(self) -> BatchSummary:
        started = time.monotonic()
        layout = LaneLayout(self.cfg.gateway.data_dir)  # read only: the pinned schema

        async def no_retry(*_: object) -> None:
            raise RuntimeError("a dry run does not retry")

        decoders = TopicDecoders(
            self.source_cfg,
            layout,
            self.columns,
            self.metrics,
            self.health,
            "batch",
            no_retry,
            new_backoff,
        )
        decoder = decoders.for_topic(self.topic)
        if decoder is None:
            raise InvariantError("decoder is not set")
        p = Progress()
        reasons: Counter[str] = Counter()
        files = DryRead(self.source_cfg, self.columns)
        p.files_total = len(files.inputs)
        for step in files:
            if step.raw is not None:
                _, result = decode_batch(decoder, step.raw, self.columns)
                reasons.update(fl.reason.value for fl in result.failures)
                p.rows += step.raw.num_rows
                p.bytes_read += step.nbytes
                continue
            if step.error is not None:
                p.files_failed += 1
                p.errors.append({"file": step.uri, "error": step.error})
            else:
                p.files_done += 1
            if self.on_progress is not None:
                self.on_progress(p)
        return BatchSummary(
            topic=self.topic,
            dry_run=True,
            files=p.files_total,
            files_done=p.files_done,
            files_skipped=0,
            files_failed=p.files_failed,
            rows=p.rows,
            bytes=p.bytes_read,
            dead_letters=sum(reasons.values()),
            dead_letter_reasons=dict(reasons),
            seconds=round(time.monotonic() - started, 3),
            errors=p.errors,
        )
