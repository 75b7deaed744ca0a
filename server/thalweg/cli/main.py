"""``twg``: run the gateway, check configs, try it locally.

Exit codes: 0 success, 1 the gateway failed while running, 2 invalid configuration or
usage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import threading
from pathlib import Path

import click

from thalweg import __version__
from thalweg.cli.output import EXIT_CONFIG, EXIT_FAILURE, EXIT_SHUTDOWN_TIMEOUT, emit, fail
from thalweg.cli.recover import recover
from thalweg.config import ThalwegConfig, load_config
from thalweg.errors import ConfigError, ShutdownTimeoutError, ThalwegError


def _setup_logging(level: str, client_level: str | None) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    # aiokafka's info is a line per join, sync and assignment of every rebalance: too
    # much for every day, and exactly what a group that never settles needs.
    default = max(logging.WARNING, logging.getLogger().level)
    client = getattr(logging, client_level.upper()) if client_level else default
    logging.getLogger("aiokafka").setLevel(client)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="twg")
@click.option(
    "--output",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="How results and errors are printed.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Log verbosity (logs go to stderr).",
)
@click.option(
    "--client-log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default=None,
    help="The Kafka client's (aiokafka's) log verbosity; default: warning, or "
    "--log-level when that is higher. 'info' logs every group join, sync and "
    "assignment: for a consumer group that does not settle.",
)
@click.pass_context
def cli(ctx: click.Context, output: str, log_level: str, client_log_level: str | None) -> None:
    """Thalweg: Kafka and Pulsar topics into Arrow, served over Arrow Flight.

    \b
    Try it:      twg quickstart
    Run it:      twg stream --config thalweg.toml
    Check it:    twg config validate thalweg.toml
    Refill a sink: twg recover --config thalweg.toml --sink lake
    """
    ctx.ensure_object(dict)
    ctx.obj["output"] = output
    _setup_logging(log_level, client_log_level)


# Set by a SIGINT/SIGTERM that arrives before the event loop runs (imports, binding
# ports): start-up then finishes and the gateway stops cleanly instead of dying mid-way.
_EARLY_STOP = threading.Event()


def _catch_signals_early() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _signum, _frame: _EARLY_STOP.set())


def run_until_signal(main: object) -> None:
    """Run ``main(stop)`` with SIGINT/SIGTERM setting ``stop`` (including one received
    during start-up)."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if _EARLY_STOP.is_set():
            stop.set()
        await main(stop)  # type: ignore[operator]

    asyncio.run(runner())


@cli.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The TOML configuration file.",
)
@click.pass_context
def stream(ctx: click.Context, config_path: Path) -> None:
    """Consume the configured topics into the raw lane and serve them over Flight.

    Runs until SIGINT or SIGTERM, then makes everything buffered durable, commits
    (Kafka) or acknowledges (Pulsar) it, and leaves the consumer group or closes the
    subscription's consumer within gateway.shutdown_timeout_s (default 25 s).

    Exit codes: 0 stopped cleanly, 1 failed, 2 bad configuration, 3 the shutdown deadline
    passed (nothing uncommitted is lost: it is read again after a restart).
    """
    from thalweg.engine import Gateway

    try:
        cfg = load_config(config_path)
        gateway = Gateway(cfg)
    except ConfigError as exc:  # also a data_dir or port this host cannot give it
        fail(ctx, str(exc), EXIT_CONFIG)
    except ThalwegError as exc:
        fail(ctx, str(exc), EXIT_FAILURE)
    except Exception as exc:  # one line for the operator; the traceback at debug level
        logging.getLogger(__name__).debug("start-up failed", exc_info=exc)
        fail(ctx, f"the gateway did not start: {type(exc).__name__}: {exc}", EXIT_FAILURE)
    emit(
        ctx,
        f"thalweg {__version__}: flight {gateway.flight_url}, admin {gateway.admin_url}",
        {"flight": gateway.flight_url, "admin": gateway.admin_url},
    )
    try:
        run_until_signal(gateway.run)
    except ShutdownTimeoutError as exc:
        fail(ctx, str(exc), EXIT_SHUTDOWN_TIMEOUT)
    except ThalwegError as exc:
        fail(ctx, str(exc), EXIT_FAILURE)


@cli.group()
def config() -> None:
    """Check a configuration file without starting anything."""


def _load_or_fail(ctx: click.Context, path: Path) -> ThalwegConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        fail(ctx, str(exc), EXIT_CONFIG)


@config.command("validate")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def config_validate(ctx: click.Context, path: Path) -> None:
    """Validate PATH (and the data contracts it names); print one line naming the first
    bad key, exit 2 if invalid. Contract rules that are not enforced are listed.

    Nothing is created, bound or connected: an existing gateway.data_dir must be a
    writable directory, but whether the ports are free is only known at start."""
    from thalweg.engine.preflight import preflight

    cfg = _load_or_fail(ctx, path)
    found = preflight(cfg)
    if found.problems:
        fail(ctx, found.problems[0], EXIT_CONFIG)
    topics = [t for s in cfg.sources for t in s.topics]
    unenforced = found.notes
    lines = [f"ok: {path}: {len(cfg.sources)} source(s), topics {', '.join(topics)}"]
    if cfg.sinks:
        lines.append(f"sinks: {', '.join(f'{s.name} ({s.kind})' for s in cfg.sinks)}")
    lines += [f"note: not enforced per record: {u}" for u in unenforced]
    emit(
        ctx,
        "\n".join(lines),
        {
            "ok": True,
            "path": str(path),
            "sources": len(cfg.sources),
            "topics": topics,
            "contract_rules_not_enforced": unenforced,
            "sinks": [s.name for s in cfg.sinks],
        },
    )


@config.command("show")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def config_show(ctx: click.Context, path: Path) -> None:
    """Print PATH with every default filled in (secrets shown as **********)."""
    cfg = _load_or_fail(ctx, path)
    data = json.loads(cfg.model_dump_json())
    emit(ctx, json.dumps(data, indent=2), data)


@config.command("secrets")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def config_secrets(ctx: click.Context, path: Path) -> None:
    """List the keys in PATH that hold secrets (never their values)."""
    cfg = _load_or_fail(ctx, path)
    keys = cfg.secrets()
    emit(ctx, "\n".join(keys) if keys else "no secrets configured", {"secrets": keys})


@cli.command()
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("./twg-quickstart"),
    show_default=True,
    help="Where the raw and decoded lanes are written.",
)
@click.option(
    "--flight-port",
    type=int,
    default=8815,
    show_default=True,
    help="Flight port on 127.0.0.1 (0 picks a free one).",
)
@click.option(
    "--http-port",
    type=int,
    default=8080,
    show_default=True,
    help="Admin HTTP port on 127.0.0.1 (0 picks a free one).",
)
@click.option(
    "--rate", type=float, default=20.0, show_default=True, help="Demo orders produced per second."
)
@click.option(
    "--duration",
    type=float,
    default=None,
    help="Stop after this many seconds (default: run until Ctrl-C).",
)
@click.pass_context
def quickstart(
    ctx: click.Context,
    data_dir: Path,
    flight_port: int,
    http_port: int,
    rate: float,
    duration: float | None,
) -> None:
    """Run everything locally: an embedded broker, demo orders, and the gateway.

    Starts a tansu broker on a free loopback port, creates the topic 'orders' with 3
    partitions, produces JSON orders at --rate per second, runs the gateway against it,
    and prints how to read the topic from Python or DuckDB. Ctrl-C stops everything.
    """
    from thalweg.cli.quickstart import run_quickstart

    try:
        run_quickstart(ctx, data_dir, flight_port, http_port, rate, duration)
    except ConfigError as exc:  # a port in use, a data dir it cannot write: its option
        message = str(exc)
        for setting, option in _QUICKSTART_OPTIONS.items():
            message = message.replace(setting, option)
        fail(ctx, message, EXIT_CONFIG)
    except ThalwegError as exc:
        fail(ctx, str(exc), EXIT_FAILURE)


_QUICKSTART_OPTIONS = {
    "gateway.flight_listen": "--flight-port",
    "gateway.http_listen": "--http-port",
    "gateway.data_dir": "--data-dir",
}


from thalweg.cli.batch import batch  # noqa: E402  (a command of its own module)
from thalweg.cli.lane import lane  # noqa: E402  (a command group of its own module)
from thalweg.cli.verify import verify  # noqa: E402  (a command of its own module)

cli.add_command(batch)
cli.add_command(lane)
cli.add_command(recover)
cli.add_command(verify)


def main() -> None:
    _catch_signals_early()
    cli(obj={})


if __name__ == "__main__":
    main()
