"""The root of every error Thalweg raises on purpose.

Library exceptions are wrapped where they cross into Thalweg (``raise SourceError(...)
from exc``) so callers handle one tree, and the ``retriable`` flag says whether trying
the same thing again can help (a broker restart: yes; a malformed ticket: no).

The tree (``tests/unit/house/test_errors_tree.py`` checks it against the classes: each
subclass of :class:`ThalwegError` in the package appears once, under its parent; a
class defined outside this module names its module in parentheses)::

    ThalwegError
    ├── ConfigError
    ├── LaneError
    │   ├── PrefixMismatchError
    │   ├── SegmentConflictError
    │   ├── UnwritableSegmentError
    │   └── OwnershipLostError
    ├── SourceError
    │   └── LoginRefusedError
    ├── ProduceError
    ├── DecodeError
    ├── TicketError
    ├── PartitionElsewhereError
    ├── ShutdownTimeoutError
    ├── PositionOverflowError (thalweg.records.position)
    ├── CorruptRecordError (thalweg.kafka.unpack)
    ├── UnsupportedSchemaError (thalweg.codecs.typemap)
    ├── RuleError (thalweg.contracts.checks)
    ├── ContractStopError (thalweg.pipeline.quality)
    ├── RegistryError (thalweg.registry.errors)
    │   └── RegistryUnavailableError (thalweg.registry.errors)
    ├── RowsRefusedError (thalweg.pipeline.dag)
    │   ├── UdfExhaustedError (thalweg.pipeline.udf)
    │   └── SidecarRefusedError (thalweg.sidecars.client)
    ├── SidecarUnavailableError (thalweg.sidecars.client)
    ├── SidecarContractError (thalweg.sidecars.client)
    ├── SinkError (thalweg.sinks.base)
    │   ├── SinkUnavailableError (thalweg.sinks.base)
    │   ├── SinkSchemaError (thalweg.sinks.base)
    │   │   ├── SinkRefusedError (thalweg.sinks.base)
    │   │   └── SinkStoppedError (thalweg.sinks.base)
    │   └── SinkBackpressureError (thalweg.sinks.base)
    ├── FollowLagError (thalweg.flight.read.stream)
    ├── HistoryGapError (thalweg.flight.read.stream)
    ├── UnstorableColumnsError (thalweg.sources.files.lane_ready)
    ├── FileReadError (thalweg.sources.files.formats.base)
    └── CheckNotRunError (thalweg.cli.recover)

Three families live beside the tree on purpose:

* ``RefusalError`` and its subclasses (``thalweg.flight.errors``) are not Thalweg errors
  but the wire's vocabulary: each is also the pyarrow exception whose gRPC status the
  client receives. The Flight handlers turn whatever they raise into one at the very
  edge (a :class:`TicketError` becomes ``INVALID_ARGUMENT``, a retriable error
  ``UNAVAILABLE``, anything else ``INTERNAL``), and nothing inside the gateway catches
  them. Keeping them out of the tree means an ``except ThalwegError`` never swallows an
  answer already meant for the client.
* :class:`InvariantError` (an ``AssertionError``) is a bug, not a condition to handle:
  it stands where an ``assert`` stood, and no handler of Thalweg errors may catch it.
* ``thalweg_client.wire.WireError`` (a ``ValueError``) belongs to the client, its own
  distribution, which does not depend on the server; the gateway wraps it at the
  adapter (``raise TicketError(...) from exc`` in ``thalweg.flight.read.tickets``).
"""

from __future__ import annotations


class ThalwegError(Exception):
    """Base of all Thalweg errors.

    Attributes:
        retriable: True when the same operation may succeed if tried again later.
    """

    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class ConfigError(ThalwegError):
    """The configuration is invalid; the message names the offending key."""


class LaneError(ThalwegError):
    """The raw or decoded lane could not be written or read."""

    retriable = True


class UnwritableSegmentError(LaneError):
    """A segment whose table Parquet cannot hold (a type it has no mapping for, such as
    an interval or a union): the same table fails every time, so it is not retried."""

    retriable = False


class PrefixMismatchError(LaneError):
    """The lane on disk was written with a different metadata column prefix."""

    retriable = False


class SegmentConflictError(LaneError):
    """A segment's name or offset range is already held by another file of the lane.

    Never overwritten, never written beside: two files over one offset would put two
    records under one (epoch, partition, offset). Raised by another writer of the same
    lane (a zombie member, a second gateway) or by a lane from an older version.
    """

    retriable = False


class OwnershipLostError(LaneError):
    """This member may no longer own the partition it was about to write (its group
    session may have expired while the process was paused); nothing was renamed."""

    retriable = False


class SourceError(ThalwegError):
    """A broker client failed; usually transient."""

    retriable = True


class LoginRefusedError(SourceError):
    """A broker refused this client's login: its credential (SASL), its certificate or
    the broker's certificate (TLS), or a token it could not get. Retried, but with the
    login backoff (seconds growing to ``login_retry_max_s``): a wrong secret retried
    at once locks accounts (many clusters lock one after a few failures)."""


class ProduceError(ThalwegError):
    """A producer could not hand records to a broker (connect, metadata or send); the
    records may be produced again (usually transient)."""

    retriable = True


class DecodeError(ThalwegError):
    """One payload could not be decoded. Never stops the stream."""


class TicketError(ThalwegError):
    """A Flight ticket, command or descriptor is malformed or names nothing."""


class InvariantError(AssertionError):
    """Something the code itself guarantees did not hold: a bug, never bad input.

    Raised where an ``assert`` once stood, so ``python -O`` (which drops asserts) cannot
    turn a broken invariant into a wrong result further on. An ``AssertionError``, as
    the assert was, and outside the :class:`ThalwegError` tree: no ``except
    ThalwegError`` turns a bug into an answer about the caller's input (a Flight handler
    reports it as ``INTERNAL`` with an incident id, as any other fault inside)."""


class ShutdownTimeoutError(ThalwegError):
    """Draining did not finish within ``gateway.shutdown_timeout_s``; whatever was not yet
    durable was not committed (it is read again after a restart)."""


class PartitionElsewhereError(ThalwegError):
    """A read needs a partition this gateway does not serve: another member of the
    consumer group owns it now (its live tail, and with a local ``data_dir`` its
    history, are there). ``owner`` is that member's advertised Flight location and
    ``positions`` where each partition of the read should resume there."""

    def __init__(self, message: str, *, topic: str, owner: str, positions: dict[int, int]):
        super().__init__(message, retriable=True)
        self.topic = topic
        self.owner = owner
        self.positions = positions
