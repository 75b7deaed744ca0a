"""One node's sidecar, called with ``do_exchange`` (the contract: ``docs/sidecars.md``).

The gateway writes the node's input in batches (at most ``batch_rows`` rows: ~0.2 ms
of fixed cost per round trip makes small batches expensive), keeps up to ``in_flight``
of them unanswered, and reads exactly one answer per batch, in order. Each answer's rows
are tied to their records: by the locator columns they kept, or by an ``_twg_row`` index
into their input batch, from which the gateway takes the locators itself.

Failures come in three kinds, told apart by the gRPC status:

* The sidecar cannot be reached or does not answer in time (UNAVAILABLE, DEADLINE_EXCEEDED,
  a refused token; ``timeout_s`` per batch): retried with backoff; after ``retries`` it
  raises :class:`SidecarUnavailableError` — the node waits, its coverage does not move.
  After ``breaker_failures`` such calls in a row the circuit opens: calls fail at once
  instead of waiting on a dead peer, except one probe call (half-open) after
  ``probe_s``, doubling after each failed probe up to ``breaker_open_s``. A probe that
  gets through closes the circuit, so a sidecar back from an outage is called again
  within a probe interval, not after a fixed wait (30 s before). The error says when
  the next probe is due (``retry_after_s``): the node's feeder retries then.
* The sidecar answered the call with an error (its transform raised: INVALID_ARGUMENT,
  INTERNAL, UNKNOWN): retried with backoff too, then raised as
  :class:`SidecarRefusedError` — the chain finds the records it refuses and dead-letters
  them with reason ``transform`` (``thalweg.pipeline.dag``). It does not count towards
  the breaker: the peer is alive.
* The sidecar broke the contract: :class:`SidecarContractError`, not retried (the answer
  would be the same).
"""

from __future__ import annotations

import logging
import random
import threading
import time

import pyarrow as pa
from pyarrow import flight

from thalweg.config.pipeline import NodeConfig
from thalweg.errors import ConfigError, InvariantError, ThalwegError
from thalweg.pipeline.dag import RowsRefusedError
from thalweg.records.columns import MetadataColumns

log = logging.getLogger(__name__)

ROW_INDEX = "_twg_row"


class SidecarUnavailableError(ThalwegError):
    """The sidecar could not be called (down, timed out, circuit open); retriable
    after ``retry_after_s``."""

    retriable = True

    def __init__(self, message: str, *, retry_after_s: float = 0.5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SidecarRefusedError(RowsRefusedError):
    """The sidecar answered these rows with an error, every time it was asked."""


# The statuses that say the sidecar was not reached or did not answer: waiting may help.
_UNREACHED = (
    flight.FlightUnavailableError,
    flight.FlightTimedOutError,
    flight.FlightUnauthenticatedError,
    flight.FlightUnauthorizedError,
    flight.FlightCancelledError,
    OSError,
)


class SidecarContractError(ThalwegError):
    """The sidecar answered outside the contract (rows not tied to their records, a
    missing or extra answer); not retriable."""


class SidecarClient:
    """Calls one node's sidecar; thread-safe (one exchange at a time)."""

    def __init__(
        self,
        node: NodeConfig,
        columns: MetadataColumns,
        *,
        batch_rows: int = 10_000,
        in_flight: int = 4,
        retries: int = 3,
        breaker_failures: int = 5,
        breaker_open_s: float = 2.0,
        probe_s: float = 0.25,
    ) -> None:
        if node.sidecar is None:
            raise InvariantError("node.sidecar is not set")
        if node.command is None:
            raise InvariantError("node.command is not set")
        self.node = node.name
        self.location = node.sidecar
        self._descriptor = flight.FlightDescriptor.for_command(node.command.encode())
        self._headers = (
            [(b"authorization", f"Bearer {node.token.get_secret_value()}".encode())]
            if node.token is not None
            else []
        )
        self._timeout_s = node.timeout_s
        self._root_certs = _read_pem(node) if node.tls_root_certs is not None else None
        self._locators = [f.name for f in columns.locator_fields]
        self._batch_rows = batch_rows
        self._in_flight = in_flight
        self._retries = retries
        self._breaker_failures = breaker_failures
        self._breaker_open_s = breaker_open_s
        self._probe_s = probe_s
        self._probe_wait = probe_s
        self._failures = 0
        self._open_until = 0.0  # the circuit is open until then: the next probe's time
        self._client: flight.FlightClient | None = None
        self._lock = threading.Lock()

    def __call__(self, table: pa.Table, *, retry_refused: bool = True) -> pa.Table:
        """The rows the sidecar derives from ``table``, with their records' locators.

        With ``retry_refused`` false an error answer is raised at once: the chain asks
        that way while it isolates the refused records of a batch already tried in full.

        Raises:
            SidecarUnavailableError: every try failed, or the circuit is open.
            SidecarContractError: the answer broke the contract.
        """
        with self._lock:
            now = time.monotonic()
            if now < self._open_until:
                raise SidecarUnavailableError(
                    f"pipeline.nodes.{self.node}: sidecar {self.location} circuit open "
                    f"after {self._failures} failed calls; next try in "
                    f"{self._open_until - now:.1f}s",
                    retry_after_s=self._open_until - now,
                )
            probing = self._failures >= self._breaker_failures  # half-open: one try
            for attempt in range(1 if probing else self._retries + 1):
                try:
                    out = self._exchange(table)
                except SidecarContractError:
                    raise
                except _UNREACHED as exc:
                    self._failed()
                    now = time.monotonic()
                    if probing or attempt == self._retries or now < self._open_until:
                        why = _one_line(exc)
                        raise SidecarUnavailableError(
                            f"pipeline.nodes.{self.node}: sidecar {self.location}: {why}",
                            retry_after_s=max(self._open_until - now, self._probe_s),
                        ) from exc
                except (flight.FlightError, pa.ArrowException) as exc:  # it answered: no
                    self._closed()
                    self._drop_connection()
                    if attempt == self._retries or not retry_refused:
                        raise SidecarRefusedError(
                            f"pipeline.nodes.{self.node}: sidecar {self.location} refused "
                            f"{table.num_rows} rows {attempt + 1} times: {_one_line(exc)}"
                        ) from exc
                else:
                    self._closed()
                    return out
                time.sleep(random.uniform(0.05, 0.2) * 2**attempt)
        raise AssertionError("unreachable")

    def _drop_connection(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _closed(self) -> None:
        """The sidecar answered: the circuit closes, probes start short again."""
        if self._failures >= self._breaker_failures:
            log.info("sidecar of node %s at %s answers again", self.node, self.location)
        self._failures = 0
        self._probe_wait = self._probe_s

    def _failed(self) -> None:
        self._failures += 1
        self._drop_connection()
        if self._failures >= self._breaker_failures:
            wait = self._probe_wait
            self._probe_wait = min(self._breaker_open_s, wait * 2)
            self._open_until = time.monotonic() + wait
            if self._failures == self._breaker_failures:
                log.warning(
                    "sidecar of node %s at %s: circuit open after %d failed calls; probing "
                    "every %g-%gs",
                    self.node,
                    self.location,
                    self._failures,
                    self._probe_s,
                    self._breaker_open_s,
                )

    def _connect(self) -> flight.FlightClient:
        if self._client is None:
            if self._root_certs is not None:
                self._client = flight.connect(self.location, tls_root_certs=self._root_certs)
            else:
                self._client = flight.connect(self.location)
        return self._client

    def _exchange(self, table: pa.Table) -> pa.Table:
        """Write the batches while a reader thread takes the answers: a sidecar blocked
        writing a large answer is always being read, so neither side waits on the other
        (writing a window ahead and reading on the same thread deadlocks once answers
        outgrow gRPC's buffers). At most ``in_flight`` batches are unanswered."""
        batches = table.combine_chunks().to_batches(max_chunksize=self._batch_rows) or [
            pa.RecordBatch.from_pylist([], schema=table.schema)
        ]
        options = flight.FlightCallOptions(
            timeout=self._timeout_s * len(batches), headers=self._headers
        )
        writer, reader = self._connect().do_exchange(self._descriptor, options)
        window = threading.Semaphore(self._in_flight)
        answers: list[pa.RecordBatch] = []
        failure: list[BaseException] = []

        def read_answers() -> None:
            try:
                for _ in batches:
                    answers.append(self._answer(reader))
                    window.release()
            except BaseException as exc:  # handed to the writing thread
                failure.append(exc)
                for _ in batches:
                    window.release()  # never leave the writer waiting on a dead reader

        thread = threading.Thread(target=read_answers, name=f"sidecar-{self.node}", daemon=True)
        with writer:
            writer.begin(table.schema)
            thread.start()
            try:
                for batch in batches:
                    window.acquire()
                    if failure:
                        break
                    writer.write_batch(batch)
            finally:
                thread.join()
            # Only once the reader is done with the call: pyarrow aborts the process when
            # done_writing races a reader that is finishing a failed call (seen in CI when
            # a sidecar was killed mid-exchange).
            if not failure:
                writer.done_writing()
                self._expect_end(reader)
        if failure:
            raise failure[0]
        located = [self._locate(out, batch) for out, batch in zip(answers, batches, strict=True)]
        return pa.Table.from_batches(located) if located else table.slice(0, 0)

    def _answer(self, reader: flight.FlightStreamReader) -> pa.RecordBatch:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            raise SidecarContractError(
                f"pipeline.nodes.{self.node}: the sidecar ended its answer early "
                "(one batch back for every batch sent)"
            ) from None
        if chunk.data is None:
            raise SidecarContractError(f"pipeline.nodes.{self.node}: an answer without rows")
        data: pa.RecordBatch = chunk.data
        return data

    def _expect_end(self, reader: flight.FlightStreamReader) -> None:
        """After one answer per batch the stream must end: an extra answer would pair
        every later one with the wrong batch."""
        try:
            reader.read_chunk()
        except StopIteration:
            return
        raise SidecarContractError(
            f"pipeline.nodes.{self.node}: the sidecar answered more batches than it was sent "
            "(one answer per batch)"
        )

    def _locate(self, out: pa.RecordBatch, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``out`` with its records' locators: kept by the sidecar, or taken from
        ``batch`` by the ``_twg_row`` index."""
        names = out.schema.names
        wanted = [c for c in self._locators if c in batch.schema.names]
        if all(c in names for c in wanted):
            return out.drop_columns([ROW_INDEX]) if ROW_INDEX in names else out
        if ROW_INDEX not in names:
            missing = [c for c in wanted if c not in names]
            raise SidecarContractError(
                f"pipeline.nodes.{self.node}: the sidecar's rows have neither the locator "
                f"columns {missing} nor an {ROW_INDEX} index into their input batch"
            )
        index = out.column(ROW_INDEX)
        if index.null_count or (
            len(index)
            and (
                pa.compute.min(index).as_py() < 0 or pa.compute.max(index).as_py() >= batch.num_rows
            )
        ):
            raise SidecarContractError(
                f"pipeline.nodes.{self.node}: {ROW_INDEX} outside its input batch "
                f"(0..{batch.num_rows - 1})"
            )
        located = out.drop_columns([ROW_INDEX, *[c for c in wanted if c in names]])
        for name in wanted:
            located = located.append_column(
                batch.schema.field(name), batch.column(name).take(index)
            )
        return located


def _read_pem(node: NodeConfig) -> bytes:
    """The node's CA bundle, read once (a missing file is a configuration error)."""
    if node.tls_root_certs is None:
        raise InvariantError("node.tls_root_certs is not set")
    try:
        return node.tls_root_certs.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"pipeline.nodes.{node.name}: tls_root_certs {node.tls_root_certs}: {exc}"
        ) from exc


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().split(". Detail:", 1)[0]
    return text.splitlines()[0] if text else type(exc).__name__
