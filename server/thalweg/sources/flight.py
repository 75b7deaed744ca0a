"""A topic of another Thalweg gateway, followed over Flight ``do_get`` (``kind =
"flight"``).

Each upstream partition is a partition of the lane topic here, read by a thread of its
own with a JSON ticket ``{"topic", "partitions": [p], "start": {"offset": next}, "end":
"follow", "metadata": "locator"}``. The upstream's positions are the positions here, so
a stream broken by the upstream (a restart, a network cut) is asked again from the next
position, and a restart resumes from the last durable one: the committed positions are a
JSON file in ``state_dir``, replaced (fsync, rename) only after the raw segment holding
them is durable. The upstream's payload columns are the row; its ``_twg_`` columns are
not payload: its record id becomes ``_twg_source_message_id`` here (provenance), its
position the position. Partitions are those the upstream lists at start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from thalweg.config.models import FlightSourceConfig
from thalweg.errors import InvariantError, SourceError
from thalweg.group.owners import OwnerDirectory
from thalweg.lane.durable import remove_interrupted_writes, write_json_durably
from thalweg.records.columns import MetadataColumns
from thalweg.records.file_rows import file_rows_batch
from thalweg.sources.base import PartitionKey, RebalanceCallback, Unbrokered
from thalweg.sources.files.manifest import Manifest

log = logging.getLogger(__name__)

QUEUE_BATCHES = 16  # per source: the readers block (gRPC flow control) beyond this
LIST_EVERY_S = 10.0  # how often the upstream's partitions are listed again


class FlightSource(Unbrokered):
    """A ``flight`` source (see the module docstring)."""

    positions_are_offsets = False

    def __init__(
        self, cfg: FlightSourceConfig, columns: MetadataColumns, owners: OwnerDirectory
    ) -> None:
        del owners
        if cfg.state_dir is None:
            raise SourceError(f"sources.{cfg.name}: no state_dir")
        self.cfg = cfg
        self.topic = cfg.topics[0]
        self.upstream = cfg.upstream_topic or self.topic
        self._columns = columns
        self._state_path = cfg.state_dir / "positions.json"
        remove_interrupted_writes(self._state_path)
        self._committed = _load(self._state_path)
        self._queue: queue.Queue[tuple[int, int, pa.RecordBatch | BaseException]] = queue.Queue(
            QUEUE_BATCHES
        )
        self._start: dict[int, int] = {}
        self._readers: dict[int, tuple[threading.Thread, threading.Event]] = {}
        self._generation: dict[int, int] = {}
        self._paused: set[int] = set()
        self._partitions: list[int] = []
        self._lock_fd: int | None = None
        self._error: str | None = None
        self._save_lock = threading.Lock()
        self._on_assigned: RebalanceCallback | None = None
        self._next_listing = float("inf")

    # -- the upstream ------------------------------------------------------------------

    def _client(self) -> fl.FlightClient:
        kwargs: dict[str, Any] = {}
        if self.cfg.tls_root_certs is not None:
            kwargs["tls_root_certs"] = self.cfg.tls_root_certs.read_bytes()
        return fl.FlightClient(self.cfg.location, **kwargs)

    def _list_partitions(self) -> list[int]:
        with self._client() as client:
            info = client.get_flight_info(
                fl.FlightDescriptor.for_path("topics", self.upstream), self._call(timeout=30)
            )
        found = set()
        for endpoint in info.endpoints:
            meta = json.loads(endpoint.app_metadata or b"{}")
            if "partition" in meta:
                found.add(int(meta["partition"]))
        return sorted(found)

    def _read(self, partition: int, start: int, stop: threading.Event, gen: int) -> None:
        """Follow one upstream partition from ``start``, reconnecting after a break."""
        position = start
        while not stop.is_set():
            ticket = {
                "topic": self.upstream,
                "partitions": [partition],
                "start": {"offset": position},
                "end": "follow",
                "metadata": "locator",
            }
            try:
                with self._client() as client:
                    reader = client.do_get(fl.Ticket(json.dumps(ticket).encode()), self._call())
                    for chunk in reader:
                        if stop.is_set():
                            reader.cancel()
                            return
                        batch = chunk.data
                        if batch.num_rows == 0:
                            continue
                        self._put(partition, gen, batch, stop)
                        last = batch.column(self._columns.position)[-1].as_py()
                        position = int(last) + 1
                        self._error = None
            except (fl.FlightError, pa.ArrowException, OSError) as exc:
                if stop.is_set():
                    return
                self._error = f"upstream {self.cfg.location}: {exc}"
                log.warning(
                    "source %s, partition %d: %s; reconnecting", self.cfg.name, partition, exc
                )
            stop.wait(self.cfg.retry_s)

    def _call(self, timeout: float | None = None) -> fl.FlightCallOptions:
        headers = []
        if self.cfg.token is not None:
            secret = self.cfg.token.get_secret_value().encode()
            headers.append((b"authorization", b"Bearer " + secret))
        return fl.FlightCallOptions(headers=headers, timeout=timeout)

    def _put(self, partition: int, gen: int, batch: pa.RecordBatch, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self._queue.put((partition, gen, batch), timeout=0.1)
                return
            except queue.Full:
                continue

    # -- the Source protocol ---------------------------------------------------------

    async def start(self, on_assigned: RebalanceCallback, on_revoked: RebalanceCallback) -> None:
        del on_revoked
        if self.cfg.state_dir is None:
            raise InvariantError("self.cfg.state_dir is not set")
        if self._lock_fd is None:
            self._lock_fd = Manifest.lock(self.cfg.state_dir, self.topic)
        try:
            self._partitions = await asyncio.to_thread(self._list_partitions)
        except (fl.FlightError, pa.ArrowException, OSError) as exc:
            raise SourceError(f"upstream {self.cfg.location} does not answer: {exc}") from exc
        if not self._partitions:
            raise SourceError(
                f"upstream {self.cfg.location} lists no partition of topic {self.upstream!r}"
            )
        self._on_assigned = on_assigned
        self._next_listing = time.monotonic() + LIST_EVERY_S
        await on_assigned([(self.topic, p) for p in self._partitions])

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[PartitionKey, pa.RecordBatch]:
        if time.monotonic() >= self._next_listing:
            await self._new_partitions()
        for p in self._partitions:
            if p not in self._readers and p not in self._paused:
                self._spawn(p)
        got: dict[int, list[pa.RecordBatch]] = {}
        n = 0
        deadline = time.monotonic() + timeout_ms / 1000
        while n < max_records:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                partition, gen, item = await asyncio.to_thread(self._queue.get, True, left)
            except queue.Empty:
                break
            if gen != self._generation.get(partition) or partition in self._paused:
                continue  # from before a seek, or held back: read again from its position
            if not isinstance(item, pa.RecordBatch):
                raise InvariantError("item is not a pa.RecordBatch")
            got.setdefault(partition, []).append(item)
            n += item.num_rows
            if not self._queue.qsize():
                break
        return {(self.topic, p): self._raw(p, batches) for p, batches in got.items()}

    async def _new_partitions(self) -> None:
        """Partitions the upstream added since the last listing, announced like a
        broker assignment (listed every ``LIST_EVERY_S``; an upstream that does not
        answer now is asked again then)."""
        self._next_listing = time.monotonic() + LIST_EVERY_S
        try:
            listed = await asyncio.to_thread(self._list_partitions)
        except (fl.FlightError, pa.ArrowException, OSError) as exc:
            log.debug("source %s: partitions not listed: %s", self.cfg.name, exc)
            return
        new = [p for p in listed if p not in self._partitions]
        if new and self._on_assigned is not None:
            self._partitions = sorted({*self._partitions, *new})
            await self._on_assigned([(self.topic, p) for p in new])

    def _raw(self, partition: int, batches: list[pa.RecordBatch]) -> pa.RecordBatch:
        c = self._columns
        table = pa.Table.from_batches(batches).combine_chunks()
        payload = table.select([n for n in table.column_names if not c.is_reserved(n)])
        positions = table.column(c.position).to_numpy()
        ids = table.column(c.record_id).cast(pa.binary()).combine_chunks()
        self._start[partition] = int(positions[-1]) + 1
        return file_rows_batch(
            table=payload,
            rows=positions,
            broken=[],
            topic=self.topic,
            partition=partition,
            uri=ids,
            mtime_ms=None,
            cluster=self.cfg.cluster_name,
            ingest_ts_us=time.time_ns() // 1000,
            columns=c,
        )

    def _spawn(self, partition: int) -> None:
        stop = threading.Event()
        gen = self._generation.get(partition, 0) + 1
        self._generation[partition] = gen
        start = self._start.get(partition, self._committed.get(partition, 0))
        thread = threading.Thread(
            target=self._read,
            args=(partition, start, stop, gen),
            name=f"twg-flight-{partition}",
            daemon=True,
        )
        self._readers[partition] = (thread, stop)
        thread.start()

    def _halt(self, partition: int) -> None:
        reader = self._readers.pop(partition, None)
        if reader is not None:
            reader[1].set()
        self._generation[partition] = self._generation.get(partition, 0) + 1

    async def commit(self, positions: dict[PartitionKey, int]) -> None:
        for (_, partition), position in positions.items():
            self._committed[partition] = max(self._committed.get(partition, 0), position)
        try:
            await asyncio.to_thread(self._save)
        except OSError as exc:
            # A full disk, say: a refused commit, as a broker's; the positions are kept
            # in memory, so the next segment's commit saves them.
            raise SourceError(f"flight positions {self._state_path} not saved: {exc}") from exc

    def _save(self) -> None:
        """One save at a time: several partitions' segments commit from worker threads."""
        with self._save_lock:
            body: dict[str, object] = {
                "upstream": self.cfg.location,
                "topic": self.upstream,
                "positions": {str(p): v for p, v in sorted(self._committed.items())},
            }
            write_json_durably(self._state_path, body)

    async def committed(self, key: PartitionKey) -> int | None:
        return self._committed.get(key[1])

    def seek(self, key: PartitionKey, position: int) -> None:
        self._halt(key[1])
        self._start[key[1]] = position

    def pause(self, keys: list[PartitionKey]) -> None:
        for _, p in keys:
            if p not in self._paused:
                self._paused.add(p)
                self._halt(p)

    def resume(self, keys: list[PartitionKey]) -> None:
        self._paused.difference_update(p for _, p in keys)

    async def probe(self, timeout_s: float = 3.0) -> bool:
        return self._error is None

    def highwater(self, key: PartitionKey) -> int | None:
        return None

    def ended(self) -> list[PartitionKey]:
        return []

    async def stop(self) -> None:
        for p in list(self._readers):
            self._halt(p)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _load(path: Path) -> dict[int, int]:
    try:
        body = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise SourceError(f"flight source state {path} cannot be read: {exc}") from exc
    return {int(p): int(v) for p, v in body.get("positions", {}).items()}
