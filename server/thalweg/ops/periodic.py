"""A job run every few seconds until the gateway stops — a run that fails is logged and
the next one decides (the lanes change under a scan; nothing here is worth stopping
ingest for)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


async def run_every(
    stop: asyncio.Event,
    interval_s: float,
    job: Callable[[], object],
    what: str,
    *,
    in_thread: bool = True,
) -> None:
    """``job()`` now and every ``interval_s`` until ``stop`` — on a worker thread when it
    does I/O (``in_thread``), else on the event loop."""
    while not stop.is_set():
        try:
            if in_thread:
                await asyncio.to_thread(job)
            else:
                job()
        except Exception:
            log.warning("%s failed; the next run decides", what, exc_info=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
