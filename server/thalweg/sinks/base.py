"""What every destination besides the raw lane is: the ``Sink`` contract.

The raw lane is primary and holds the source commit; a sink is secondary (ADR-0012 in
the seed plan): it never holds the source back, and its progress is what it reports
durable. A sink is fed from the durable lanes by :class:`thalweg.recovery.feeder.SinkFeeder`
— the same loop for the live edge and for a replay after an outage — so the contract is
small and exact:

* ``open`` — connect, and answer with the coverage the destination records itself (an
  Iceberg snapshot summary, a Postgres offsets table, the names of Arrow IPC files), which
  the feeder trusts over its own coverage store: a crash between a sink's commit and the
  store's write then costs nothing, and a destination that lost data is refilled;
* ``write`` — Arrow rows (with their ``_twg_`` locator columns) that account for one
  :class:`Span` of positions (a span may hold fewer rows than positions: dead-lettered
  records, transaction markers);
* ``flush`` — make everything written durable and answer with exactly the spans that
  landed; on failure nothing written since the last flush counts, and the feeder writes
  it again (so a sink must be idempotent by ``_twg_record_id`` or record its coverage
  atomically with its data);
* ``close`` and ``health``.

:class:`BufferedSink` does the bookkeeping (rows by topic, spans, health) so a backend
implements one ``_commit`` that runs on a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import pyarrow as pa

from thalweg.errors import ThalwegError
from thalweg.records.columns import MetadataColumns
from thalweg.records.ranges import merge_ranges
from thalweg.sinks.contract import Capabilities, Held
from thalweg.sinks.table_docs import NONE as NO_DOCS
from thalweg.sinks.table_docs import TableDocs

# (topic, partition, epoch): an epoch's positions are names in one broker log only.
CoverageKey = tuple[str, int, int]
Ranges = dict[CoverageKey, list[tuple[int, int]]]


class SinkError(ThalwegError):
    """A destination refused or failed a write or a flush."""

    reason = "error"


class SinkUnavailableError(SinkError):
    """The destination cannot be reached or failed mid-commit; nothing since the last
    flush landed. Retried with backoff — or after ``retry_after_s`` when the destination
    said when to try again (a sidecar's circuit breaker) — and the gap is replayed from
    the raw lane."""

    retriable = True
    reason = "unavailable"

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SinkSchemaError(SinkError):
    """The rows' schema cannot go into the destination as it is (a narrowing or
    incompatible type change). The sink is ``degraded``; the records stay in the raw lane
    for a replay once the destination or the configuration is changed."""

    reason = "schema"


class SinkRefusedError(SinkSchemaError):
    """The destination refuses values of the rows for good (a NUL in a Postgres
    ``text``, a ``uint64`` past 2**63-1): retrying the same rows cannot help. With
    ``on_refused = "dead_letter"`` the feeder finds the records by halving and sets them
    aside in the sink's dead-letter lane; with ``"stop"`` the sink is ``degraded``."""

    reason = "refused"

    def __init__(
        self, message: str, *, records: Mapping[tuple[str, int], Collection[int]] | None = None
    ) -> None:
        """``records``: when the destination can name them, the refused records'
        positions per (topic, partition) — set aside at once, without a search."""
        super().__init__(message)
        self.records = records


def name_records(
    into: dict[tuple[str, int], set[int]], topic: str, rows: pa.Table, columns: MetadataColumns
) -> None:
    """Add the (topic, partition) → positions of ``rows`` to ``into`` (for a
    :class:`SinkRefusedError` that names what it refuses)."""
    if not rows.num_rows:
        return
    parts = rows.column(columns.partition).to_pylist()
    positions = rows.column(columns.position).to_pylist()
    for p, pos in zip(parts, positions, strict=True):
        into.setdefault((topic, int(p)), set()).add(int(pos))


class SinkStoppedError(SinkSchemaError):
    """A strict data-quality node above the sink stopped at a broken rule: the sink is
    ``degraded`` and nothing moves until the contract or the data is fixed."""

    reason = "contract"


class SinkBackpressureError(SinkError):
    """The destination cannot take more now; retry the same batch after
    ``retry_after_s`` (nothing of it was written)."""

    retriable = True
    reason = "backpressure"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SinkState(StrEnum):
    UP = "up"
    DEGRADED = "degraded"
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class SinkHealth:
    """A sink's entry in /health (never gating readiness: the raw lane is primary)."""

    state: SinkState
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Span:
    """Positions ``[start, end)`` of one partition's epoch that a write accounts for."""

    topic: str
    partition: int
    epoch: int
    start: int
    end: int

    @property
    def key(self) -> CoverageKey:
        return (self.topic, self.partition, self.epoch)


@dataclass(frozen=True, slots=True)
class Landed:
    """What one flush made durable: per (topic, partition, epoch), half-open ranges.

    Ranges, not a high-water mark: a sink may land positions out of order (a retried
    batch, a replay from the raw lane), and coverage must never claim a gap.
    """

    ranges: Ranges = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not any(self.ranges.values())

    @staticmethod
    def of(spans: list[Span]) -> Landed:
        out: Ranges = {}
        for s in spans:
            out.setdefault(s.key, []).append((s.start, s.end))
        return Landed({k: merge_ranges(v) for k, v in out.items()})


class SinkSettings(Protocol):
    """What every sink's settings have: a ``[[sinks]]`` table (``thalweg.config.sinks``,
    each kind its own model) or a node lane's settings (``sinks/node_lane.py``)."""

    @property
    def name(self) -> str: ...

    @property
    def topics(self) -> list[str]: ...


#: A sink's settings type: each destination takes its own typed section.
C = TypeVar("C", bound=SinkSettings)


class Sink(ABC, Generic[C]):
    """One configured destination.

    Args:
        cfg: its typed ``[[sinks]]`` table (a model of ``thalweg.config.sinks``).
        data_dir: the gateway's ``data_dir`` (embedded defaults live under it).
        columns: the gateway's metadata columns (its ``metadata_prefix``): the names the
            rows carry and the destination gets.
    """

    kind: ClassVar[str]
    # "exactly-once": coverage committed with the data; "at-least-once": deduplicated or
    # duplicated by a replay (docs/sinks.md says which and why).
    guarantee: ClassVar[str]
    capabilities: ClassVar[Capabilities]

    def __init__(self, cfg: C, data_dir: Path, columns: MetadataColumns | None = None) -> None:
        self.cfg: C = cfg
        self.name: str = cfg.name
        self.data_dir = Path(data_dir)
        self.columns = columns if columns is not None else MetadataColumns()
        # A table, path or directory per value of a row's field ("{tenant}_orders"); a
        # routed destination's replay skips what its own record covers (sinks/routes.py).
        self.routed = False
        # Per topic, what its table says about itself (sinks/table_docs.py): set by whoever
        # builds the sink from the topics' contracts; a kind that keeps no table ignores it.
        self.docs: Mapping[str, TableDocs] = {}

    def table_docs(self, topic: str) -> TableDocs:
        """What ``topic``'s table should say about itself (nothing, by default)."""
        return self.docs.get(topic, NO_DOCS)

    async def open(self) -> Landed | None:
        """Connect; the coverage the destination records itself, or None if it keeps
        none (then the coverage store is the only record)."""
        return None

    @abstractmethod
    async def write(self, rows: pa.Table, span: Span) -> None:
        """Accept ``rows`` (with their ``_twg_`` locator columns) for ``span``; not
        yet durable.

        Raises:
            SinkBackpressureError: not accepted now; retry after the given delay.
        """

    @abstractmethod
    async def flush(self) -> Landed:
        """Make everything written so far durable; exactly the spans that landed.

        Raises:
            SinkError: nothing written since the last flush landed (it is written again).
        """

    @abstractmethod
    async def close(self) -> None:
        """Release connections; what was not flushed is not durable."""

    @abstractmethod
    def health(self) -> SinkHealth:
        """The sink's state now, for /health."""

    def holds(self, wanted: list[str]) -> Held:
        """What the destination holds now, read back from it (blocking, read-only: it
        creates nothing): its coverage record and the ``wanted`` locator columns of its
        rows per configured topic. The default: a destination that keeps no record.

        Raises:
            Exception: the destination could not be read back (a damaged file, a
                database that does not answer); the caller names it.
        """
        return Held(None, {})

    def rebuild_step(self) -> str:
        """The runbook's step that rebuilds lost rows from the lane: a pass trusts the
        coverage, so what says the rows are there goes first."""
        return (
            "remove the sink's coverage store, data_dir/coverage/<sink>.json, and run "
            "twg recover again (its rows are sent again)"
        )


class BufferedSink(Sink[C]):
    """Rows buffered per topic until ``flush``, which commits them in one ``_commit``
    on a worker thread (the backends' clients block)."""

    def __init__(self, cfg: C, data_dir: Path, columns: MetadataColumns | None = None) -> None:
        super().__init__(cfg, data_dir, columns)
        self._rows: dict[str, list[pa.Table]] = {}
        self._spans: list[Span] = []
        self._health = SinkHealth(SinkState.UP)
        self.buffered_rows = 0

    async def open(self) -> Landed | None:
        """Drop anything buffered (a re-open follows a failure) and connect."""
        self._rows, self._spans, self.buffered_rows = {}, [], 0
        try:
            found = await asyncio.to_thread(self._open)
        except SinkError as exc:
            self._health = SinkHealth(SinkState.DOWN, str(exc))
            raise
        self._health = SinkHealth(SinkState.UP, "connected")
        return found

    async def write(self, rows: pa.Table, span: Span) -> None:
        if rows.num_rows:
            self._rows.setdefault(span.topic, []).append(rows)
            self.buffered_rows += rows.num_rows
        self._spans.append(span)

    async def flush(self) -> Landed:
        if not self._spans:
            return Landed()
        # Taken here, on the event loop: writes made while the commit runs on its thread
        # go to fresh buffers and into the next flush (the feeder reads ahead).
        rows, spans = self._rows, self._spans
        self._rows, self._spans, self.buffered_rows = {}, [], 0
        self._take()
        landed = Landed.of(spans)
        started = time.monotonic()
        await self._committed(self._commit, rows, landed.ranges)
        self._health = SinkHealth(SinkState.UP, f"last flush {time.monotonic() - started:.2f}s")
        return landed

    async def land(self, items: list[tuple[pa.Table, Span]]) -> Landed:
        """Commit ``items`` alone, now, beside whatever is buffered (which stays for
        the next flush): how the feeder lands a part of a flush the destination refused
        while it looks for the records it refuses.

        Raises:
            SinkRefusedError: the destination refuses values of these rows.
            SinkError: as ``flush``.
        """
        rows: dict[str, list[pa.Table]] = {}
        for table, span in items:
            if table.num_rows:
                rows.setdefault(span.topic, []).append(table)
        landed = Landed.of([span for _, span in items])
        started = time.monotonic()
        await self._committed(self._commit_alone, items, rows, landed.ranges)
        self._health = SinkHealth(SinkState.UP, f"last commit {time.monotonic() - started:.2f}s")
        return landed

    async def _committed(self, commit: Any, *args: Any) -> None:
        """Run a commit on a worker thread; map what it raises, keep the health."""
        try:
            try:
                await asyncio.to_thread(commit, *args)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                # Values the destination's types cannot hold (a uint64 past 2**63-1):
                # retrying will not help; the records that carry them are refused.
                raise SinkRefusedError(f"sink {self.name!r}: rows do not convert: {exc}") from exc
            except pa.ArrowNotImplementedError as exc:
                # A type with no mapping: every row has it; a person must look.
                raise SinkSchemaError(f"sink {self.name!r}: rows do not convert: {exc}") from exc
        except SinkSchemaError as exc:
            self._health = SinkHealth(SinkState.DEGRADED, str(exc))
            raise
        except SinkError as exc:
            self._health = SinkHealth(SinkState.DOWN, str(exc))
            raise

    async def close(self) -> None:
        self._rows, self._spans, self.buffered_rows = {}, [], 0
        await asyncio.to_thread(self._close)

    def health(self) -> SinkHealth:
        return self._health

    @abstractmethod
    def _commit(self, rows: Mapping[str, list[pa.Table]], covered: Ranges) -> None:
        """Land ``rows`` (by topic) durably, and with them the ``covered`` ranges where
        the destination records coverage; all or nothing.

        Raises:
            SinkUnavailableError: the destination failed; nothing landed.
            SinkSchemaError: the rows cannot go into the destination as they are.
        """

    def _commit_alone(
        self,
        items: list[tuple[pa.Table, Span]],
        rows: Mapping[str, list[pa.Table]],
        covered: Ranges,
    ) -> None:
        """``_commit`` of ``items`` only (a subclass that buffers ``items`` itself
        commits them from there)."""
        self._commit(rows, covered)

    def _take(self) -> None:
        """Move what a subclass buffers itself into its commit's hands (on the event
        loop, when a flush starts)."""

    def _open(self) -> Landed | None:
        """Connect (blocking); the destination's own record of coverage, if it keeps one.

        Raises:
            SinkUnavailableError: the destination cannot be reached.
        """
        return None

    def _close(self) -> None:
        """Release the backend's connections (blocking)."""
