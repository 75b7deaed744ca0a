"""Read ahead of a stream: the next segment is read while the current one is sent.

A ``do_get`` alternates two kinds of work — decoding Parquet (pyarrow, GIL released) and
writing batches to gRPC — and done in turn each waits for the other. Producing the
items of an iterator on a helper thread, at most ``depth`` ahead, overlaps them: the
measured single-stream rate rose from 0.55x to about 0.7x of a bare in-memory Flight
server (load-tests/flight_bench.py). Memory stays bounded: ``depth`` items wait at most.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()
_POLL_S = 0.2


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def prefetched(items: Iterator[T], cancelled: Callable[[], bool], depth: int = 1) -> Iterator[T]:
    """Yield ``items`` in order, produced up to ``depth`` ahead on a helper thread.

    An exception in ``items`` is re-raised here, in order. When the consumer stops early
    (closes this generator) or ``cancelled()`` turns true, the helper stops too and
    closes ``items``.
    """
    q: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def offer(item: object) -> bool:
        while not stop.is_set() and not cancelled():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer(item):
                    return
            offer(_DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            offer(_Failed(exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    helper = threading.Thread(target=produce, name="twg-prefetch", daemon=True)
    helper.start()
    try:
        while True:
            try:
                item = q.get(timeout=_POLL_S)
            except queue.Empty:
                if cancelled() or (not helper.is_alive() and q.empty()):
                    return
                continue
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item  # type: ignore[misc]
    finally:
        stop.set()
