"""``twg recover``: one recovery pass of one sink, then a summary.

The same feeder as ``twg stream`` runs (recovery/feeder.py), once: it takes the sink's
feeder lock (so it refuses while a gateway with role ``both`` or ``recovery`` feeds the
sink), trusts the destination's own record of coverage, replays every gap of the raw
lane in bounded windows — limited to ``--topic`` and ``[--from, --to)`` when given —
flushes, and exits. Run it with the gateway's own configuration; an ingesting gateway
(role ``ingest``) may keep running on the same ``data_dir``.

Trusting the coverage, a pass cannot see rows the destination lost while its record
still claims them (a table's rows deleted by hand, files removed): after the pass the
destination is checked against the lane as ``twg verify --sink`` checks it, and a
destination that lacks what it claims is named and the command fails — it never says
"ok" over rows that are not there (``--no-check`` skips the check, for a table too
large to read back).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from thalweg.cli.output import EXIT_CONFIG, EXIT_FAILURE, emit, fail, output_option
from thalweg.config import load_config
from thalweg.config.models import ThalwegConfig
from thalweg.errors import ConfigError, LaneError, ThalwegError
from thalweg.lane.layout import LaneLayout
from thalweg.lane.remote.mirror import LaneMirror
from thalweg.lane.remote.objectstore import ObjectStore
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders
from thalweg.recovery.feeder import PassSummary
from thalweg.verify.report import Finding
from thalweg.verify.run import verify
from thalweg.verify.sinks import destination


@click.command()
@output_option
@click.option(
    "--config",
    "-c",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The gateway's configuration file (its data_dir holds the raw lane).",
)
@click.option("--sink", "sink_name", required=True, help="The [[sinks]] name to recover.")
@click.option("--topic", default=None, help="Only this topic (default: all of the sink's).")
@click.option("--from", "start", type=int, default=None, help="First position to replay.")
@click.option("--to", "end", type=int, default=None, help="Replay up to this position (exclusive).")
@click.option(
    "--no-check",
    "check",
    flag_value=False,
    default=True,
    help="Do not check the destination against the lane after the pass (the check reads "
    "the destination's positions and record ids back, and the lanes' positions of "
    "--topic or of every topic; a bucket lane is fetched first): for a table too large.",
)
@click.pass_context
def recover(
    ctx: click.Context,
    config_path: Path,
    sink_name: str,
    topic: str | None,
    start: int | None,
    end: int | None,
    check: bool,
) -> None:
    """Replay the raw lane's records that sink NAME is missing, once, and exit.

    \b
    Then the destination is checked against the lane (as twg verify --sink NAME does,
    over all the sink holds of --topic or of every topic, not only the window): rows
    its coverage claims and it does not hold (a table emptied by hand, files removed)
    are named, and the exit code is 1. A sink fed through a pipeline node, or a Flight
    sink, has its coverage checked only (the summary's "checked" line says so).
    \b
    Exit codes: 0 the sink holds the window and the check found nothing missing; 1 the
    sink failed, part of the window waits for a decoded segment, the destination lacks
    rows its coverage claims, or the check could not read it (the summary says which;
    what landed stays landed); 2 bad configuration, usage, or an unreadable coverage
    store.
    """
    try:
        cfg = load_config(config_path)
        sink_cfg = next((s for s in cfg.sinks if s.name == sink_name), None)
        if sink_cfg is not None and topic is not None and topic not in sink_cfg.topics:
            raise ConfigError(f"sink {sink_name!r} does not receive topic {topic!r}")
        layout = LaneLayout(cfg.gateway.data_dir)
        columns = MetadataColumns(cfg.gateway.metadata_prefix)
        mirror = _bucket(cfg, layout, [topic] if topic else list(getattr(sink_cfg, "topics", [])))
        [feeder] = build_feeders(cfg, layout, columns, only=sink_name, mirror=mirror)
    except ThalwegError as exc:  # the configuration, or an unreadable coverage store
        fail(ctx, str(exc), EXIT_CONFIG)

    async def one_pass() -> PassSummary:
        try:
            await feeder.open()
            return await feeder.pass_once(topic=topic, start=start, end=end, final=True)
        finally:
            await feeder.close()

    try:
        summary = asyncio.run(one_pass())
    except Exception as exc:  # the sink failed: say so, keep what landed
        fail(ctx, f"sink {sink_name!r}: {exc}", EXIT_FAILURE, sink=sink_name)
    s = summary
    text = (
        f"sink {sink_name}: {s.rows} rows over {s.positions} positions in {s.seconds:.1f}s "
        f"({s.flushes} flushes); lag {s.lag_before} -> {s.lag_after} positions"
    )
    if s.waiting:
        text += f"\nincomplete, waiting: {s.waiting}"
    found: list[Finding] | None = None
    checked = ""
    if check:
        try:
            found, checked = _lost_rows(cfg, sink_name, topic)
        except Exception as exc:  # the pass's summary still stands; the check did not run
            text += f"\nthe destination check could not run: {exc} (--no-check skips it)"
            failed = {"ok": False, "sink": sink_name, **s.as_dict(), "check_error": str(exc)}
            emit(ctx, text, failed)
            ctx.exit(EXIT_FAILURE)
    if checked:
        text += f"\nchecked: {checked}"
    if found:
        text += f"\nthe destination does not hold what sink {sink_name}'s coverage claims:"
        text += "".join(f"\n  {f.code}: {f.where}: {f.message}" for f in found)
        text += "\n" + _rebuild(cfg, sink_cfg)
    ok = not s.waiting and not found
    data = {"ok": ok, "sink": sink_name, **s.as_dict()}
    if found is not None:
        data["check"] = [{"code": f.code, "where": f.where, "message": f.message} for f in found]
        data["checked"] = checked
    emit(ctx, text, data)
    if not ok:
        ctx.exit(EXIT_FAILURE)


def _bucket(cfg: ThalwegConfig, layout: LaneLayout, topics: list[str]) -> LaneMirror | None:
    """With the lanes in a bucket: the partitions of ``topics`` fetched into the cache
    first (this host may never have seen them), and the mirror the feeder keeps the
    sink's dead-letter lane in (None: local lanes).

    Raises:
        ConfigError: the bucket does not answer.
    """
    if not cfg.gateway.lanes_in_object_store:
        return None
    mirror = LaneMirror(layout, ObjectStore(cfg.gateway.object_store))
    try:
        mirror.sync_floors()
        for t, partitions in sorted(mirror.partitions().items()):
            if t in topics:
                for p in sorted(partitions):
                    mirror.sync(t, p)
    except LaneError as exc:
        raise ConfigError(f"gateway.data_dir: the object store does not answer: {exc}") from exc
    return mirror


#: What ``twg verify`` calls rows a destination's coverage claims and it lacks.
LOST = frozenset({"sink_missing", "table_missing"})
#: What it calls a destination or coverage store it could not read.
UNREADABLE = frozenset({"destination_unreadable", "store_unreadable"})


def _rebuild(cfg: ThalwegConfig, sink_cfg: Any) -> str:
    """The runbook's step for this sink, as its destination says it
    (``Sink.rebuild_step``; docs/operations.md, "Verifying exactness")."""
    return (
        "a pass trusts the coverage and does not write covered rows again; to rebuild "
        f"from the lane: {destination(cfg, sink_cfg).rebuild_step()} "
        '(docs/operations.md, "Verifying exactness")'
    )


class CheckNotRunError(ThalwegError):
    """The destination (or the sink's coverage store) could not be read back: nothing
    was checked, so the command may not say "ok"."""


def _lost_rows(cfg: ThalwegConfig, sink: str, topic: str | None) -> tuple[list[Finding], str]:
    """What ``twg verify --sink`` finds the destination lacking of its coverage (read-
    only, brokers not asked). Only that: the lanes' own findings are not the sink's to
    mend, and its other findings (a duplicate, a store ahead of the destination) are not
    what a replay could fix — ``twg verify`` names them. A destination it could not read
    (a damaged file, a database that does not answer) is a check that did not run.
    With them, what was checked (``twg verify``'s summary of the sink)."""
    report = verify(cfg, topic=topic, sink=sink, broker=False)
    unread = [
        f.message for f in report.findings if f.code in UNREADABLE and f.where == f"sink {sink}"
    ]
    if unread:
        raise CheckNotRunError("; ".join(unread))
    mine = f"sink {sink}:"
    lost = [f for f in report.findings if f.code in LOST and f.where.startswith(mine)]
    return lost, str(report.sinks.get(sink, {}).get("summary", ""))
