"""Read a file's next chunks on a thread of its own while the current ones are decoded
and written: reading (parsing CSV, decompressing Parquet) overlaps the rest of the run.
Two chunks ahead at most, so memory stays bounded by the chunk size."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Literal

from thalweg.errors import InvariantError
from thalweg.sources.files.formats import Chunk

DEPTH = 2

_Item = (
    tuple[Literal["chunk"], Chunk]
    | tuple[Literal["end"], None]
    | tuple[Literal["error"], BaseException]
)


class ReadAhead(Iterator[Chunk]):
    """``chunks``, produced ahead by a reader thread; its errors re-raised in order."""

    def __init__(self, chunks: Iterator[Chunk], depth: int = DEPTH) -> None:
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=depth)
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(chunks,), name="twg-read-ahead", daemon=True
        )
        self._thread.start()

    def _put(self, item: _Item) -> bool:
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, chunks: Iterator[Chunk]) -> None:
        try:
            for chunk in chunks:
                if not self._put(("chunk", chunk)):
                    return
            self._put(("end", None))
        except BaseException as exc:  # handed to the consumer, in order
            self._put(("error", exc))

    def __next__(self) -> Chunk:
        kind, value = self._queue.get()
        if kind == "chunk":
            if not isinstance(value, Chunk):
                raise InvariantError("value is not a Chunk")
            return value
        if kind == "end":
            raise StopIteration
        if not isinstance(value, BaseException):
            raise InvariantError("value is not a BaseException")
        raise value

    def close(self) -> None:
        """Stop reading ahead (a stopped run); the thread ends at its next chunk."""
        self._closed.set()
        while not self._queue.empty():
            self._queue.get_nowait()
