"""The coverage store: which positions each secondary sink holds durably (ADR-0053).

Per sink, per (topic, partition, epoch): gap-aware covered ranges of positions — not a
high-water mark, because a sink can land positions out of order (a retried batch, a
replay from the raw lane) and a high-water mark would claim the gap below it. The store
lives with the raw lane under ``data_dir/coverage/``, never inside the sink it
describes, so a sink that lost its data cannot also have lost the record of it.

It is written behind, on an interval: it may lag what a sink holds (a replay that
deduplication absorbs), and it never over-claims — only positions a sink acknowledged
as durable (:class:`~thalweg.sinks.base.Landed`) are ever added, and a write replaces
the file atomically (temp → fsync → rename → directory fsync). What the raw lane covers
minus what a sink covers is that sink's gap: the recovery's work list.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path
from typing import IO
from urllib.parse import quote

from thalweg.errors import ConfigError, LaneError
from thalweg.lane.coverage import Coverage
from thalweg.lane.durable import ensure_dir, remove_interrupted_writes, write_json_durably
from thalweg.records.ranges import subtract_ranges
from thalweg.sinks.base import CoverageKey, Ranges

FORMAT_VERSION = 1
COVERAGE_DIR = "coverage"


class CoverageStore:
    """The covered positions of one sink (thread-safe; ``flush`` makes them durable)."""

    def __init__(self, data_dir: Path, sink: str) -> None:
        self.sink = sink
        self.path = Path(data_dir) / COVERAGE_DIR / f"{quote(sink, safe='')}.json"
        self._lock = threading.Lock()
        self._covered: dict[CoverageKey, Coverage] = {}
        self._dirty = False
        self._owner: IO[str] | None = None
        self._load()

    def claim(self) -> None:
        """Become the one process that feeds this sink (an exclusive ``flock`` on
        ``<sink>.lock``, released when the process ends, however it ends).

        Raises:
            ConfigError: another process feeds the sink (a gateway with role ``both``
                or ``recovery``, or a ``twg recover``); two feeders would race on the
                store and on the destination.
        """
        ensure_dir(self.path.parent)
        lock = open(self.path.with_suffix(".lock"), "a+", encoding="utf-8")  # noqa: SIM115
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            raise ConfigError(
                f"sink {self.sink!r} is already fed by pid {holder} on this data_dir; one "
                'feeder per sink (stop it, or give this gateway role = "ingest")'
            ) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        self._owner = lock
        remove_interrupted_writes(self.path)  # the one feeder now

    def release(self) -> None:
        if self._owner is not None:
            self._owner.close()
            self._owner = None

    def replace(self, ranges: Ranges) -> None:
        """Take ``ranges`` as the whole truth (the destination's own record, trusted
        over this store because it is committed with the data: what the store claims
        beyond it — a crash before a commit, a table restored from an old snapshot — is
        dropped, and replayed)."""
        fresh: dict[CoverageKey, Coverage] = {}
        for key, rs in ranges.items():
            cov = Coverage()
            for a, b in rs:
                cov.add(a, b)
            if cov.ranges:
                fresh[key] = cov
        with self._lock:
            if {k: c.ranges for k, c in fresh.items()} != {
                k: c.ranges for k, c in self._covered.items() if c.ranges
            }:
                self._covered = fresh
                self._dirty = True

    def snapshot(self) -> Ranges:
        with self._lock:
            return {k: list(c.ranges) for k, c in self._covered.items()}

    def add(self, key: CoverageKey, start: int, end: int) -> None:
        """Record that the sink holds ``[start, end)`` of ``key`` durably."""
        if end <= start:
            return
        with self._lock:
            self._covered.setdefault(key, Coverage()).add(start, end)
            self._dirty = True

    def remove(self, key: CoverageKey, ranges: list[tuple[int, int]]) -> None:
        """Forget ``ranges`` of ``key``: the destination was found not to hold their rows
        (deleted behind the gateway's back, ``recovery/recheck.py``), so they are gaps
        again and the feeder writes them once more."""
        with self._lock:
            cov = self._covered.get(key)
            if cov is None or not ranges:
                return
            fresh = Coverage()
            for a, b in subtract_ranges(cov.ranges, ranges):
                fresh.add(a, b)
            self._covered[key] = fresh
            self._dirty = True

    def covered(self, key: CoverageKey) -> list[tuple[int, int]]:
        with self._lock:
            cov = self._covered.get(key)
            return list(cov.ranges) if cov is not None else []

    def keys(self) -> list[CoverageKey]:
        with self._lock:
            return sorted(self._covered)

    def gaps(self, key: CoverageKey, lane: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """What the raw lane covers (``lane``: its ranges) and this sink does not."""
        return subtract_ranges(lane, self.covered(key))

    def flush(self) -> bool:
        """Write the store durably if it changed; True when it wrote.

        Raises:
            LaneError: the store could not be written (retriable: the sink's progress
                is still in memory and in the sink itself).
        """
        with self._lock:
            if not self._dirty:
                return False
            body = {
                "format_version": FORMAT_VERSION,
                "sink": self.sink,
                "covered": [
                    {"topic": t, "partition": p, "epoch": e, "ranges": cov.ranges}
                    for (t, p, e), cov in sorted(self._covered.items())
                ],
            }
            self._dirty = False
        try:
            write_json_durably(self.path, body)
        except OSError as exc:
            with self._lock:
                self._dirty = True
            raise LaneError(f"coverage of sink {self.sink!r} not written: {exc}") from exc
        return True

    def _load(self) -> None:
        try:
            body = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise LaneError(f"{self.path}: unreadable coverage store: {exc}") from exc
        if body.get("format_version") != FORMAT_VERSION or body.get("sink") != self.sink:
            raise LaneError(
                f"{self.path}: coverage store of {body.get('sink')!r}, format "
                f"{body.get('format_version')!r}; expected {self.sink!r}, {FORMAT_VERSION}"
            )
        for entry in body["covered"]:
            cov = Coverage()
            for a, b in entry["ranges"]:
                cov.add(int(a), int(b))
            self._covered[(entry["topic"], int(entry["partition"]), int(entry["epoch"]))] = cov
