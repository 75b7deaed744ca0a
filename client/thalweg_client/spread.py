"""One stream over partitions that live on different gateways of a consumer group.

Several gateways on one consumer group split a topic's partitions; each partition's
live tail (and, with a ``data_dir`` per replica, its history) is at the gateway that
owns it. A gateway refuses to serve a partition it does not own with ``UNAVAILABLE``
and a binary detail ``{"relocate": {"owner", "positions"}}`` — also mid-stream, after
sending everything it holds, when a rebalance moved the partition away.

:class:`SpreadStream` reads each partition from its owner (the location of its
``get_flight_info`` endpoint) on its own thread and merges the batches into one reader.
A partition that moves resumes at the position the gateway named; one whose gateway
died resumes after the last row received (its position column) once the group gave the
partition to another member. Nothing is read twice and nothing is skipped.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

RETRY_S = 0.5
_DONE = object()


def relocation(exc: BaseException) -> dict[int, int] | None:
    """Where each partition of a refused read resumes, from the gateway's error detail;
    None when ``exc`` is not a relocation."""
    extra = getattr(exc, "extra_info", None)
    if not extra:
        return None
    try:
        body = json.loads(extra)["relocate"]
        return {int(p): int(pos) for p, pos in body["positions"].items()}
    except (ValueError, KeyError, TypeError):
        return None


def position_column(schema: pa.Schema) -> str | None:
    """The stream's position column (``<prefix>position`` beside
    ``<prefix>source_partition``), if the read kept it."""
    for field in schema:
        if field.name.endswith("position") and pa.types.is_integer(field.type):
            prefix = field.name[: -len("position")]
            if schema.get_field_index(prefix + "source_partition") >= 0:
                return str(field.name)
    return None


class SpreadStream:
    """Per-partition streams at their owners, merged.

    Args:
        home: the gateway asked where each partition is (``get_flight_info``).
        connect: a client for an endpoint's location (None: ``home``).
        options: call options (headers) for every call.
        encode: turns a ticket dict into ticket bytes.
        base: the read's ticket; a partition's stream is planned as it with
            ``partitions`` (and, once a position is known, ``start``) replaced.
        schema: the merged stream's schema (batches are fitted to it).
        positions: where each partition resumes (a gateway named them when it ended a
            stream mid-way); None: the read starts as ``base`` asks.
        give_up_s: how long a partition whose gateway is unreachable is retried
            (while the group moves it to another member).
    """

    def __init__(
        self,
        home: fl.FlightClient,
        connect: Callable[[str | None], fl.FlightClient],
        options: fl.FlightCallOptions,
        encode: Callable[[dict[str, Any]], bytes],
        base: dict[str, Any],
        schema: pa.Schema,
        positions: dict[int, int] | None = None,
        give_up_s: float = 120.0,
    ) -> None:
        self._home = home
        self._connect = connect
        self._options = options
        self._encode = encode
        self._base = base
        self.schema = schema
        self._positions = positions
        self._give_up_s = give_up_s
        self._follow = base.get("end") == "follow"
        self._position_col = position_column(schema)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=8)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._readers: dict[int, fl.FlightStreamReader] = {}
        self._threads: list[threading.Thread] = []
        self._inexact: set[int | None] = set()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The merged batches; raises the first error a partition could not get past."""
        plans: dict[int, list[fl.FlightEndpoint] | None]
        if self._positions is not None:
            plans = dict.fromkeys(self._positions)
        else:
            info = self._home.get_flight_info(self._describe(self._base), options=self._options)
            plans = {}
            for endpoint in info.endpoints:
                p = json.loads(endpoint.app_metadata or b"{}").get("partition")
                plans.setdefault(p, []).append(endpoint)  # type: ignore[union-attr]
        for p, endpoints in sorted(plans.items(), key=lambda x: (x[0] is None, x[0])):
            t = threading.Thread(
                target=self._run, args=(p, endpoints), daemon=True, name=f"spread-{p}"
            )
            self._threads.append(t)
            t.start()
        alive = len(self._threads)
        try:
            while alive:
                item = self._queue.get()
                if item is _DONE:
                    alive -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Stop every partition's stream (on the gateways too)."""
        self._stop.set()
        with self._lock:
            readers = list(self._readers.values())
        for reader in readers:
            reader.cancel()
        while True:  # unblock workers waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break

    def _describe(self, t: dict[str, Any]) -> fl.FlightDescriptor:
        return fl.FlightDescriptor.for_command(self._encode(t))

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, p: int | None, endpoints: list[fl.FlightEndpoint] | None) -> None:
        """Read partition ``p``; re-plan it from the position reached when its gateway
        relocates it, dies, or (following) ends the stream while shutting down."""
        replan = dict(self._base)
        if p is not None:
            replan["partitions"] = [p]
            if self._positions is not None:
                replan["start"] = {"offset": self._positions[p]}
        pending = endpoints
        unreachable_since: float | None = None
        try:
            while not self._stop.is_set():
                try:
                    if pending is None:
                        info = self._home.get_flight_info(
                            self._describe(replan), options=self._options
                        )
                        pending = list(info.endpoints)
                    while pending:
                        if not self._read(p, pending[0], replan):
                            return
                        unreachable_since = None
                        end = json.loads(pending.pop(0).app_metadata or b"{}").get("end")
                        if end is not None:
                            replan["start"] = {"offset": end}
                    if not self._follow or self._stop.is_set():
                        return
                    pending = None  # a follow stream ended: its gateway is going away
                    time.sleep(RETRY_S)
                except fl.FlightError as exc:
                    pending = None
                    moved = relocation(exc)
                    if moved is not None and p is not None and p in moved:
                        replan["start"] = {"offset": moved[p]}
                        continue
                    # Sent elsewhere before anything was read, or the gateway is gone:
                    # plan again (the group moves a dead member's partitions).
                    retry = moved is not None or isinstance(
                        exc, (fl.FlightUnavailableError, fl.FlightTimedOutError)
                    )
                    now = time.monotonic()
                    unreachable_since = unreachable_since or now
                    if (
                        retry
                        and p not in self._inexact
                        and now - unreachable_since < self._give_up_s
                    ):
                        time.sleep(RETRY_S)
                        continue
                    self._put(exc)
                    return
        finally:
            self._put(_DONE)

    def _read(self, p: int | None, endpoint: fl.FlightEndpoint, replan: dict[str, Any]) -> bool:
        """Stream one endpoint into the queue, keeping ``replan``'s start at the
        position after the last row received; False when stopped."""
        loc = endpoint.locations[0].uri.decode() if endpoint.locations else None
        reader = self._connect(loc).do_get(endpoint.ticket, options=self._options)
        with self._lock:
            self._readers[p if p is not None else -1] = reader
        for chunk in reader:
            batch = chunk.data
            if batch.num_rows:
                if self._position_col is not None and p is not None:
                    last = batch.column(self._position_col)[batch.num_rows - 1].as_py()
                    replan["start"] = {"offset": int(last) + 1}
                else:
                    self._inexact.add(p)  # no position to resume from: never retried
            if not self._put(fit(batch, self.schema)):
                return False
        return True


def fit(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` in ``schema``'s columns (a partition's stream planned later may carry
    columns the schema gained since; ones it lacks are null)."""
    if batch.schema == schema:
        return batch
    columns = []
    for field in schema:
        i = batch.schema.get_field_index(field.name)
        if i < 0:
            columns.append(pa.nulls(batch.num_rows, field.type))
        else:
            col = batch.column(i)
            columns.append(col if col.type == field.type else col.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
