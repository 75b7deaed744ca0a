"""``twg batch``: files through a source's pipeline into its lane topic, once.

Progress goes to stderr: a live bar on a terminal, a log line every
``LOG_EVERY_S`` otherwise. The summary goes to stdout (JSON with ``--output json``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from thalweg.cli.output import (
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_WITH_ERRORS,
    emit,
    fail,
)
from thalweg.config import load_config
from thalweg.errors import ConfigError, ThalwegError

log = logging.getLogger("thalweg.batch")

LOG_EVERY_S = 10.0


@click.command()
@click.option(
    "--config",
    "-c",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The configuration file: its data_dir holds the lanes and the batch manifest.",
)
@click.option(
    "--source",
    "source_name",
    default=None,
    help="The source whose pipeline the files go through (default: the only files source, "
    "or the only source). A Kafka or Pulsar source lends its topic, contract and limits.",
)
@click.option("--topic", default=None, help="The lane topic to write (default: the source's).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Read and decode every file, check the contract, count what would be "
    "dead-lettered; write nothing.",
)
@click.argument("paths", nargs=-1)
@click.pass_context
def batch(
    ctx: click.Context,
    config_path: Path,
    source_name: str | None,
    topic: str | None,
    dry_run: bool,
    paths: tuple[str, ...],
) -> None:
    """Read files through a source's pipeline into its lane topic, once, and exit.

    PATHS are files, directories (every file below with a known suffix) or globs, local
    or s3://bucket/prefix/*.parquet. Formats by suffix: .parquet, .csv, .tsv, .jsonl
    (.ndjson, .json), .avro, .arrow (.ipc, .feather), .xlsx; .gz/.zst/.bz2 are read
    through. Each file is one partition of the topic and its row numbers are positions
    (docs/batch.md).

    Resumable: the manifest in <data_dir>/batch/<topic>/ records each file by path,
    size, modification time and SHA-256; a re-run skips files already durable and
    resumes a file cut short after its last durable row. A row that does not parse or
    breaks the contract goes to the dead-letter lane with its reason and locator; an
    unreadable file is reported and the run goes on.

    \b
    Examples:
      twg batch -c thalweg.toml drops/2026-12-01/
      twg batch -c thalweg.toml --source orders --topic orders_backfill 'exports/*.csv.gz'
      twg --output json batch -c thalweg.toml --dry-run vendor.xlsx

    \b
    Exit codes: 0 every file read; 4 completed with errors (files that could not be read
    are listed); 130 interrupted (re-run to resume); 1 failed; 2 bad configuration.
    """
    from thalweg.engine.batch import BatchRun, BatchSummary, files_source

    try:
        cfg = load_config(config_path)
        source = files_source(cfg, source_name, topic, list(paths))
        run = BatchRun(cfg, source, on_progress=_display(ctx))
    except ConfigError as exc:
        fail(ctx, str(exc), EXIT_CONFIG)
    except ThalwegError as exc:
        fail(ctx, str(exc), EXIT_FAILURE)

    async def main() -> BatchSummary:
        if dry_run:
            return await run.dry_run()
        interrupt = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, interrupt.set)
        return await run.run(interrupt)

    try:
        summary = asyncio.run(main())
    except ConfigError as exc:
        fail(ctx, str(exc), EXIT_CONFIG)
    except ThalwegError as exc:
        fail(ctx, str(exc), EXIT_FAILURE)
    except Exception as exc:  # one line for the operator; the traceback at debug level
        log.debug("batch failed", exc_info=exc)
        fail(ctx, f"the batch run failed: {type(exc).__name__}: {exc}", EXIT_FAILURE)
    finally:
        _display_close(ctx)
    emit(ctx, _text(summary), summary.as_dict())
    if summary.interrupted:
        ctx.exit(EXIT_INTERRUPTED)
    if summary.errors:
        ctx.exit(EXIT_WITH_ERRORS)


def _text(s: Any) -> str:
    what = "dry run" if s.dry_run else "batch"
    lines = [
        f"{what} into topic {s.topic}: {s.files_done} of {s.files} files read "
        f"({s.files_skipped} already durable, {s.files_failed} failed), {s.rows:,} rows, "
        f"{s.bytes / 1e6:,.1f} MB in {s.seconds:.1f}s ({s.rows_per_s:,.0f} rows/s)",
    ]
    if s.dead_letters:
        why = ", ".join(f"{k} {v}" for k, v in sorted(s.dead_letter_reasons.items()))
        verb = "would go" if s.dry_run else "went"
        lines.append(f"{s.dead_letters:,} rows {verb} to the dead-letter lane ({why})")
    for name, pas in s.sinks.items():
        if pas.get("fed") is False:
            lines.append(f"sink {name}: not fed here ({pas['reason']})")
        else:
            lines.append(f"sink {name}: {pas.get('rows', 0):,} rows")
    for e in s.errors:
        lines.append(f"error: {e['file']}: {e['error']}")
    if s.interrupted:
        lines.append("interrupted: what was read is durable; run the same command to resume")
    return "\n".join(lines)


def _display(ctx: click.Context) -> Any:
    """The progress hook: a rich bar on a terminal, log lines otherwise."""
    if sys.stderr.isatty() and ctx.obj.get("output") != "json":
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
        )

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),  # stdout is the summary's
            transient=False,
        )
        task = bar.add_task("files", total=None, detail="")
        bar.start()
        ctx.obj["progress_bar"] = bar

        def show(p: Any) -> None:
            elapsed = max(1e-9, time.monotonic() - p.started)
            seen = p.files_done + p.files_skipped + p.files_failed
            bar.update(
                task,
                description=f"files {seen}/{p.files_total}",
                total=p.bytes_total or None,
                completed=p.bytes_read,
                detail=f"{p.rows:,} rows  {p.rows / elapsed:,.0f} rows/s  "
                f"{len(p.errors)} errors  {p.broken_rows} unparsed",
            )

        return show
    last = [0.0]

    def log_line(p: Any) -> None:
        now = time.monotonic()
        if now - last[0] < LOG_EVERY_S:
            return
        last[0] = now
        elapsed = max(1e-9, now - p.started)
        log.info(
            "batch: %d/%d files, %d rows, %.1f/%.1f MB, %.0f rows/s, %d errors",
            p.files_done + p.files_skipped + p.files_failed,
            p.files_total,
            p.rows,
            p.bytes_read / 1e6,
            p.bytes_total / 1e6,
            p.rows / elapsed,
            len(p.errors),
        )

    return log_line


def _display_close(ctx: click.Context) -> None:
    bar = ctx.obj.pop("progress_bar", None)
    if bar is not None:
        bar.stop()
