"""``twg lane``: look at a lane's partitions and act on the ones the gateway holds.

These work on the data directory itself, with the gateway running or stopped: a held
partition is written by nobody, and a running gateway notices within seconds that its
divergence was resolved and starts the partition again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from thalweg.cli.output import EXIT_CONFIG, EXIT_FAILURE, emit, fail
from thalweg.config import ThalwegConfig, load_config
from thalweg.errors import ConfigError, LaneError
from thalweg.lane.epochs import close_epoch, closed_epochs, current_epoch, read_divergence
from thalweg.lane.layout import LaneLayout

_CONFIG = click.option(
    "--config",
    "-c",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The gateway's configuration file (its gateway.data_dir is the lane).",
)


def _layout(ctx: click.Context, path: Path) -> LaneLayout:
    try:
        cfg: ThalwegConfig = load_config(path)
    except ConfigError as exc:
        fail(ctx, str(exc), EXIT_CONFIG)
    return LaneLayout(cfg.gateway.data_dir)


@click.group()
def lane() -> None:
    """Inspect lane partitions; close the epoch of a diverged one."""


@lane.command("status")
@_CONFIG
@click.pass_context
def lane_status(ctx: click.Context, config_path: Path) -> None:
    """List every partition of the lane with its epoch, closed epochs and whether the
    gateway holds it because its broker log no longer continues the lane."""
    layout = _layout(ctx, config_path)
    rows: list[dict[str, Any]] = []
    for topic in layout.topics():
        for partition in layout.partitions(topic):
            marker = read_divergence(layout, topic, partition)
            rows.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "epoch": current_epoch(layout, topic, partition),
                    "closed_epochs": closed_epochs(layout, topic, partition),
                    "diverged": marker.info() if marker is not None else None,
                }
            )
    lines = [
        f"{r['topic']}[{r['partition']}] epoch {r['epoch']}"
        + (f" (closed: {r['closed_epochs']})" if r["closed_epochs"] else "")
        + (f" DIVERGED: {r['diverged']['detail']}" if r["diverged"] else "")
        for r in rows
    ]
    emit(ctx, "\n".join(lines) or "the lane holds no partition", {"partitions": rows})


@lane.command("new-epoch")
@_CONFIG
@click.option("--topic", required=True, help="The diverged partition's topic.")
@click.option("--partition", required=True, type=int, help="The diverged partition.")
@click.pass_context
def lane_new_epoch(ctx: click.Context, config_path: Path, topic: str, partition: int) -> None:
    """Close the epoch of a diverged partition: its files move, unchanged, under
    epochs/epoch=N/ (still readable), and the partition starts again in epoch N+1 at the
    broker's log start. Refused for a partition that has not diverged."""
    layout = _layout(ctx, config_path)
    try:
        epoch = close_epoch(layout, topic, partition)
    except LaneError as exc:
        fail(ctx, str(exc), EXIT_FAILURE)
    emit(
        ctx,
        f"{topic}[{partition}]: epoch {epoch - 1} closed; epoch {epoch} starts at the "
        "broker's log start",
        {"topic": topic, "partition": partition, "closed": epoch - 1, "epoch": epoch},
    )
