"""The lane position: one int64 order key per record within a partition.

Every lane is named, sliced and resumed by position, so both transports need one.
Kafka's is the offset. A Pulsar message id is ``(ledger, entry, batch_index)`` — ordered
lexicographically, with no single integer — so it is packed into the bits of an int64 in
that order (the approach Kafka-on-Pulsar's ``MessageIdUtils`` took): comparing packed
positions compares message ids, and equal ids pack equal, which is what redelivery
deduplication and the record id need.

The bit widths bound what fits: ledger ids below 2**28 (268 M ledgers), entry ids below
2**22 (4.2 M entries per ledger; Pulsar rolls a ledger over at 50 000 by default) and
batch indexes below 2**13 (8192 messages per batch; Pulsar's default batch is 1000). A
message id outside that is refused with :class:`PositionOverflowError` — never packed
into a position that sorts wrongly.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from thalweg.errors import ThalwegError

LEDGER_BITS = 28
ENTRY_BITS = 22
BATCH_BITS = 13
_ENTRY_SHIFT = BATCH_BITS
_LEDGER_SHIFT = ENTRY_BITS + BATCH_BITS


class PositionOverflowError(ThalwegError):
    """A Pulsar message id does not fit the packed position (not retriable)."""


def pack_message_ids(
    ledger: npt.NDArray[np.int64], entry: npt.NDArray[np.int64], batch: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Positions for arrays of message-id parts (``batch`` -1 = not batched = 0)."""
    batch = np.maximum(batch, 0)
    for name, part, bits in (
        ("ledger id", ledger, LEDGER_BITS),
        ("entry id", entry, ENTRY_BITS),
        ("batch index", batch, BATCH_BITS),
    ):
        if len(part) and (part.min() < 0 or part.max() >= 1 << bits):
            bad = int(part.max() if part.max() >= 1 << bits else part.min())
            raise PositionOverflowError(
                f"Pulsar {name} {bad} does not fit Thalweg's lane position "
                f"(0 <= {name} < 2**{bits}); see docs/pulsar.md, 'Positions'"
            )
    out: npt.NDArray[np.int64] = (
        (ledger.astype(np.int64) << _LEDGER_SHIFT)
        | (entry.astype(np.int64) << _ENTRY_SHIFT)
        | batch.astype(np.int64)
    )
    return out


def pack_message_id(ledger: int, entry: int, batch_index: int) -> int:
    """The position of one message id."""
    arr = pack_message_ids(
        np.array([ledger], np.int64), np.array([entry], np.int64), np.array([batch_index], np.int64)
    )
    return int(arr[0])


def unpack_position(position: int) -> tuple[int, int, int]:
    """``(ledger, entry, batch_index)`` of a packed Pulsar position."""
    return (
        position >> _LEDGER_SHIFT,
        (position >> _ENTRY_SHIFT) & ((1 << ENTRY_BITS) - 1),
        position & ((1 << BATCH_BITS) - 1),
    )
