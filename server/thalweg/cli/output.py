"""One place that decides how results and errors look: text for people, JSON for tools."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

EXIT_OK = 0
EXIT_FAILURE = 1  # the gateway failed while running
EXIT_CONFIG = 2  # the configuration (or a command line) is invalid
EXIT_SHUTDOWN_TIMEOUT = 3  # draining passed gateway.shutdown_timeout_s
EXIT_WITH_ERRORS = 4  # twg batch completed, but some files could not be read
EXIT_INTERRUPTED = 130  # twg batch stopped by SIGINT/SIGTERM (a re-run resumes)

F = TypeVar("F", bound=Callable[..., Any])


def _set_output(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.ensure_object(dict)["output"] = value


def output_option(command: F) -> F:
    """``--output text|json`` on a subcommand too (``twg verify -c F --output json``),
    where a user puts it after the command's other options; it overrides the global one."""
    return click.option(
        "--output",
        type=click.Choice(["text", "json"]),
        default=None,
        expose_value=False,
        is_eager=True,
        callback=_set_output,
        help="How results and errors are printed (as `twg --output ...`).",
    )(command)


def emit(ctx: click.Context, text: str, data: dict[str, Any]) -> None:
    if ctx.obj.get("output") == "json":
        click.echo(json.dumps(data, default=str))
    else:
        click.echo(text)


def fail(ctx: click.Context, message: str, code: int, **data: Any) -> NoReturn:
    if ctx.obj.get("output") == "json":
        click.echo(json.dumps({"ok": False, "error": message, **data}), err=True)
    else:
        click.echo(f"error: {message}", err=True)
    sys.exit(code)
