"""``twg recover``: one recovery pass of one sink, then a summary.

The same feeder as ``twg stream`` runs (recovery/feeder.py), once: it takes the sink's
feeder lock (so it refuses while a gateway with role ``both`` or ``recovery`` feeds the
sink), trusts the destination's own record of coverage, replays every gap of the raw
lane in bounded windows — limited to ``--topic`` and ``[--from, --to)`` when given —
flushes, and exits. Run it with the gateway's own configuration; an ingesting gateway
(role ``ingest``) may keep running on the same ``data_dir``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from thalweg.cli.output import EXIT_CONFIG, EXIT_FAILURE, emit, fail
from thalweg.config import load_config
from thalweg.errors import ConfigError, ThalwegError
from thalweg.lane.layout import LaneLayout
from thalweg.records.columns import MetadataColumns
from thalweg.recovery.build import build_feeders
from thalweg.recovery.feeder import PassSummary


@click.command()
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
@click.pass_context
def recover(
    ctx: click.Context,
    config_path: Path,
    sink_name: str,
    topic: str | None,
    start: int | None,
    end: int | None,
) -> None:
    """Replay the raw lane's records that sink NAME is missing, once, and exit.

    \b
    Exit codes: 0 the sink holds the window; 1 the sink failed, or part of the window
    waits for a decoded segment (the summary says which; what landed stays landed);
    2 bad configuration, usage, or an unreadable coverage store.
    """
    try:
        cfg = load_config(config_path)
        sink_cfg = next((s for s in cfg.sinks if s.name == sink_name), None)
        if sink_cfg is not None and topic is not None and topic not in sink_cfg.topics:
            raise ConfigError(f"sink {sink_name!r} does not receive topic {topic!r}")
        layout = LaneLayout(cfg.gateway.data_dir)
        columns = MetadataColumns(cfg.gateway.metadata_prefix)
        [feeder] = build_feeders(cfg, layout, columns, only=sink_name)
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
    emit(ctx, text, {"ok": not s.waiting, "sink": sink_name, **s.as_dict()})
    if s.waiting:
        ctx.exit(EXIT_FAILURE)
