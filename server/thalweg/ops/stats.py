"""``/stats``: what each pipeline stage did over the last 30 seconds.

Per stage (``fetch``, ``decode``, ``write``, ``commit``, and ``node:<name>`` for each
pipeline node that has run): records/s, bytes/s, p50/p99 of
the stage's own latency (time spent in that step, not end to end), and its queue depth
(work waiting for it). A stage with work waiting and nothing finished for
``stall_after_s`` is named in ``stalled`` — so "ingest stopped" becomes "the write stage
has 40,000 records waiting and has finished nothing for 12 s".

Events are appended from the event loop and read from the admin thread; a lock keeps the
deques consistent. Old events are dropped as new ones arrive and when read, so memory is
bounded by the event rate times the window.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

STAGES = ("fetch", "decode", "write", "commit")


@dataclass
class _Stage:
    events: deque[tuple[float, int, int, float]] = field(default_factory=deque)
    queue: int = 0
    last_done: float | None = None
    queue_since: float | None = None


class PipelineStats:
    """Sliding-window statistics per stage."""

    def __init__(
        self,
        window_s: float = 30.0,
        stall_after_s: float = 10.0,
        on_done: Callable[[str, int], None] | None = None,
    ) -> None:
        self._on_done = on_done
        self.window_s = window_s
        self.stall_after_s = stall_after_s
        self._stages = {s: _Stage() for s in STAGES}
        self._lock = threading.Lock()

    def done(self, stage: str, records: int, nbytes: int, seconds: float) -> None:
        """``stage`` finished a unit of work of ``records``/``nbytes`` in ``seconds``.

        Never raises: a statistic must not stop ingest. Negative counts (a position that
        went backwards) count as none.
        """
        records, nbytes = max(0, records), max(0, nbytes)
        now = time.monotonic()
        with self._lock:
            st = self._stages.setdefault(stage, _Stage())  # node stages come and go
            st.events.append((now, records, nbytes, seconds))
            st.last_done = now
            self._trim(st, now)
        if self._on_done is not None:
            try:
                self._on_done(stage, records)
            except Exception:
                log.exception("stage statistics callback failed (ignored)")

    def queued(self, stage: str, depth: int) -> None:
        """How much work (records) waits for ``stage`` now."""
        now = time.monotonic()
        with self._lock:
            st = self._stages.setdefault(stage, _Stage())
            if depth > 0 and st.queue <= 0:
                st.queue_since = now
            st.queue = depth

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        out: dict[str, Any] = {"window_s": self.window_s, "stages": {}, "stalled": []}
        with self._lock:
            for name, st in self._stages.items():
                self._trim(st, now)
                events = list(st.events)
                lat = np.array([e[3] for e in events]) if events else np.array([0.0])
                span = min(self.window_s, now - events[0][0]) if events else self.window_s
                span = max(span, 1.0)
                out["stages"][name] = {
                    "records_per_s": round(sum(e[1] for e in events) / span, 1),
                    "bytes_per_s": round(sum(e[2] for e in events) / span, 1),
                    "p50_ms": round(float(np.percentile(lat, 50)) * 1000, 2),
                    "p99_ms": round(float(np.percentile(lat, 99)) * 1000, 2),
                    "queue_depth": st.queue,
                    "idle_s": None if st.last_done is None else round(now - st.last_done, 1),
                }
                waiting_since = st.queue_since if st.queue > 0 else None
                if waiting_since is not None:
                    quiet_since = max(waiting_since, st.last_done or waiting_since)
                    if now - quiet_since >= self.stall_after_s:
                        out["stalled"].append(name)
        return out

    def _trim(self, st: _Stage, now: float) -> None:
        while st.events and st.events[0][0] < now - self.window_s:
            st.events.popleft()
