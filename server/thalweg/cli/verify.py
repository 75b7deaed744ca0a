"""``twg verify``: the lanes, the cluster and the sinks of a configuration checked
against each other, read-only — safe beside a running gateway (``thalweg.verify``)."""

from __future__ import annotations

from pathlib import Path

import click

from thalweg.cli.output import EXIT_CONFIG, EXIT_FAILURE, emit, fail, output_option
from thalweg.config import load_config
from thalweg.errors import ConfigError, ThalwegError
from thalweg.verify import verify as run_verify


@click.command()
@output_option
@click.option(
    "--config",
    "-c",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The gateway's configuration file (its data_dir holds the lanes).",
)
@click.option("--topic", default=None, help="Only this topic (default: every topic).")
@click.option("--sink", "sink_name", default=None, help="Only this [[sinks]] name.")
@click.option(
    "--no-broker",
    "broker",
    flag_value=False,
    default=True,
    help="Do not ask the Kafka cluster for log ends and the group's commits.",
)
@click.pass_context
def verify(
    ctx: click.Context,
    config_path: Path,
    topic: str | None,
    sink_name: str | None,
    broker: bool,
) -> None:
    """Check that every record is in the lanes once and in every sink once.

    Per partition: the raw lane's coverage (gaps, overlaps, positions held twice, files
    a listing hides), the decoded and dead-letter lanes against the raw lane, the
    broker's log and the group's commit against the lane; per sink, its coverage against
    the lane and against the destination's own record, and the destination's rows
    (missing, twice, extra). Reads only: nothing is written, locked or created.

    \b
    Exit codes: 0 everything agrees (warnings may be printed); 1 a finding of level
    error (the report names each, per partition); 2 bad configuration or usage.
    `--output json` (here or before the command) prints a machine-readable report.
    Judged against a stopped gateway (no process holds the lane's running lock), an
    interrupted write or a partition the broker holds and the lane does not is an
    error; beside a running one, a warning.
    """
    try:
        cfg = load_config(config_path)
        if sink_name is not None and all(s.name != sink_name for s in cfg.sinks):
            raise ConfigError(f"no [[sinks]] named {sink_name!r} in {config_path}")
        report = run_verify(cfg, topic=topic, sink=sink_name, broker=broker)
    except ThalwegError as exc:
        fail(ctx, str(exc), EXIT_CONFIG)
    emit(ctx, report.as_text(), report.as_dict())
    if not report.ok:
        ctx.exit(EXIT_FAILURE)
