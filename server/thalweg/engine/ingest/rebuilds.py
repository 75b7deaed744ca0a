"""Decoded twins rebuilt while the gateway runs, after a write of them failed.

A decoded-lane write that fails never blocks the raw lane (the primary): the raw
segment is made durable and committed without its twin. Start-up rebuilds missing twins
(``pipeline.redecode``), but a gateway that runs for weeks after a disk filled for a
minute would otherwise serve that range without a decoded file until its next restart:
compaction waits on the run that holds it, and a reader of the decoded directory sees a
hole. So each such segment gets a task here that decodes its raw file again, retried
with backoff, until the twin is on disk — and, on a bucket lane, in the bucket beside its
raw object — or the segment is gone (retention, compaction) or the partition is no
longer this gateway's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import pyarrow as pa

from thalweg.codecs.base import ArrowDecoder
from thalweg.engine.context import LaneContext, new_backoff
from thalweg.errors import ThalwegError
from thalweg.lane.layout import Lane, Segment
from thalweg.pipeline.redecode import redecode
from thalweg.sources.base import PartitionKey

log = logging.getLogger(__name__)


class DecodedRebuilds:
    """The rebuilds in flight for one source's partitions.

    Args:
        owned: whether a partition is still this source's (a revoked one's next owner
            rebuilds at its assignment).
        decoder: the topic's decoder, None for a topic that is not decoded.
    """

    def __init__(
        self,
        ctx: LaneContext,
        owned: Callable[[PartitionKey], bool],
        decoder: Callable[[str], ArrowDecoder | None],
    ) -> None:
        self._ctx = ctx
        self._owned = owned
        self._decoder = decoder
        self._tasks: dict[tuple[PartitionKey, str], asyncio.Task[None]] = {}

    def schedule(self, key: PartitionKey, segment: Segment) -> None:
        """Rebuild ``segment``'s decoded twin (once per segment however often asked)."""
        if self._decoder(key[0]) is None:
            return
        name = (key, segment.path.name)
        if name not in self._tasks:
            task = asyncio.create_task(self._rebuild(key, segment))
            self._tasks[name] = task
            task.add_done_callback(lambda _t: self._tasks.pop(name, None))

    async def _rebuild(self, key: PartitionKey, segment: Segment) -> None:
        topic, partition = key
        twin = self._ctx.layout.partition_dir(Lane.DECODED, topic, partition) / segment.path.name
        backoff = new_backoff()
        while True:
            await asyncio.sleep(backoff.next_delay())  # the write just failed: not at once
            decoder = self._decoder(topic)
            if decoder is None or not self._owned(key) or not segment.path.exists():
                return
            try:
                if not twin.exists():
                    await asyncio.to_thread(
                        redecode,
                        self._ctx.writer,
                        decoder,
                        self._ctx.columns,
                        topic,
                        partition,
                        [segment],
                    )
                mirror = self._ctx.mirror
                if mirror is not None:  # the raw object went up without it: now the twin
                    await asyncio.to_thread(
                        mirror.publish_twins, topic, partition, segment.path.name
                    )
            except FileNotFoundError:
                return  # removed meanwhile (retention, compaction)
            except (OSError, pa.ArrowException, ThalwegError) as exc:
                self._ctx.metrics.retries.labels("decoded_rebuild").inc()
                log.warning("decoded twin of %s not rebuilt yet: %s", segment.path, exc)
                continue
            log.info("decoded twin of %s rebuilt", segment.path)
            return

    async def stop(self) -> None:
        """Cancel what is in flight (start-up rebuilds the rest)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
