"""``twg verify``: the lanes, the cluster and the sinks of a configuration checked
against each other, read-only — safe beside a running gateway (``thalweg.verify``)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
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
@click.option(
    "--deep",
    is_flag=True,
    help="Also read back every record the broker retains and compare its key, value, "
    "headers and timestamp with the raw lane's row (Kafka topics; costs a read of both).",
)
@click.option(
    "--partition",
    type=click.IntRange(min=0),
    default=None,
    help="With --deep: only this partition (of each topic checked).",
)
@click.option(
    "--since",
    default=None,
    metavar="WHEN",
    help="With --deep: only the segments holding records from WHEN on: an ISO 8601 time "
    "(2026-12-07T06:00:00Z) or an age (90s, 30m, 6h, 7d).",
)
@click.pass_context
def verify(
    ctx: click.Context,
    config_path: Path,
    topic: str | None,
    sink_name: str | None,
    broker: bool,
    deep: bool,
    partition: int | None,
    since: str | None,
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

    `--deep` compares each record the broker still retains with the raw lane, field by
    field, read with another Kafka decoder than the gateway's: a record held reshaped
    (a value cut, a header lost, a null key stored empty) is an error, an offset the
    broker compacted away since is not. `--partition` and `--since` bound it.
    """
    if not deep and (partition is not None or since is not None):
        fail(ctx, "--partition and --since bound --deep: add --deep", EXIT_CONFIG)
    try:
        since_ms = parse_since(since) if since is not None else None
        cfg = load_config(config_path)
        if sink_name is not None and all(s.name != sink_name for s in cfg.sinks):
            raise ConfigError(f"no [[sinks]] named {sink_name!r} in {config_path}")
        report = run_verify(
            cfg,
            topic=topic,
            sink=sink_name,
            broker=broker,
            deep=deep,
            partition=partition,
            since_ms=since_ms,
        )
    except ThalwegError as exc:
        fail(ctx, str(exc), EXIT_CONFIG)
    emit(ctx, report.as_text(), report.as_dict())
    if not report.ok:
        ctx.exit(EXIT_FAILURE)


_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> int:
    """``--since`` as milliseconds since the epoch: an age (``30m``) before ``now``, or
    an ISO 8601 time (one without a zone is UTC).

    Raises:
        ConfigError: neither.
    """
    age = _AGE.match(text.strip())
    if age is not None:
        seconds = float(age.group(1)) * _UNIT_S[age.group(2)]
        return int(((time.time() if now is None else now) - seconds) * 1000)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"--since {text!r}: give an ISO 8601 time (2026-12-07T06:00:00Z) or an age "
            "(90s, 30m, 6h, 7d)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)
