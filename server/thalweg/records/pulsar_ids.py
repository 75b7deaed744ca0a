"""Read the parts of many Pulsar message ids at once, from their serialized form.

The Python client answers one C++ call per field per message (``ledger_id``,
``entry_id``, ``batch_index``, ``partition``: 0.6 µs each here, load-tests/
pulsar_profile.py), and the raw lane needs every id's serialized bytes anyway (the
``message_id`` column). So the bytes are read once and their fields are decoded for a
whole fetch with numpy: one pass per protobuf field, every message at a time.

The bytes are Pulsar's ``MessageIdData`` (PulsarApi.proto)::

    required uint64 ledgerId = 1;  required uint64 entryId = 2;
    optional int32 partition = 3 [default = -1];  optional int32 batch_index = 4 [default = -1];
    repeated int64 ack_set = 5;  optional int32 batch_size = 6;
    optional MessageIdData first_chunk_message_id = 7;

Fields this module does not need are skipped by their wire type, so a client that adds
fields does not break it; bytes that are not a well-formed message raise ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

_MAX_VARINT = 10
_FIELDS = {1: "ledger", 2: "entry", 3: "partition", 4: "batch"}
_DEFAULTS = {"ledger": -1, "entry": -1, "partition": -1, "batch": -1}


@dataclass(frozen=True, slots=True)
class MessageIdParts:
    """The fields of ``n`` message ids, as int64 arrays (-1 where a field is absent)."""

    ledger: npt.NDArray[np.int64]
    entry: npt.NDArray[np.int64]
    partition: npt.NDArray[np.int64]
    batch: npt.NDArray[np.int64]

    def take(self, rows: npt.NDArray[np.intp]) -> MessageIdParts:
        return MessageIdParts(
            self.ledger[rows], self.entry[rows], self.partition[rows], self.batch[rows]
        )

    @staticmethod
    def concat(parts: Sequence[MessageIdParts]) -> MessageIdParts:
        return MessageIdParts(
            np.concatenate([p.ledger for p in parts]),
            np.concatenate([p.entry for p in parts]),
            np.concatenate([p.partition for p in parts]),
            np.concatenate([p.batch for p in parts]),
        )


def _varints(
    buf: npt.NDArray[np.uint8], at: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """The varint starting at each of ``at`` in ``buf`` (padded with ``_MAX_VARINT``
    zeros), and its length in bytes."""
    window = buf[at[:, None] + np.arange(_MAX_VARINT)]  # (n, 10)
    last = (window & 0x80) == 0
    if not last.any(axis=1).all():
        raise ValueError("a varint runs past 10 bytes")
    length = last.argmax(axis=1) + 1
    used = np.arange(_MAX_VARINT) < length[:, None]
    groups = np.where(used, window & 0x7F, 0).astype(np.uint64)
    shifts = (np.arange(_MAX_VARINT, dtype=np.uint64) * np.uint64(7))[None, :]
    values = np.bitwise_or.reduce(groups << shifts, axis=1)
    return values, length.astype(np.int64)


def parse_message_ids(serialized: Sequence[bytes]) -> MessageIdParts:
    """Ledger, entry, partition and batch index of each serialized message id.

    The ids a consumer receives hold varint fields only (ledger, entry, partition, batch
    index, batch size): then every varint of the whole fetch is decoded at once, and
    each id's fields alternate tag, value (~0.1 µs an id). Any other layout takes the
    general path.

    Raises:
        ValueError: a message id's bytes are not a well-formed ``MessageIdData``.
    """
    n = len(serialized)
    if n == 0:
        return _parse_general(serialized)
    lengths = np.fromiter(map(len, serialized), np.int64, n)
    buf = np.frombuffer(b"".join(serialized), np.uint8)
    if (lengths == 0).any() or buf[-1] & 0x80:
        return _parse_general(serialized)  # which names the fault
    ends = np.cumsum(lengths)
    starts = ends - lengths
    vend = np.flatnonzero((buf & 0x80) == 0)  # the last byte of each varint
    vstart = np.concatenate(([0], vend[:-1] + 1))
    vlen = vend - vstart + 1
    first = np.searchsorted(vstart, starts)  # each id's first varint
    counts = np.diff(np.append(first, len(vstart)))
    if (
        (first >= len(vstart)).any()
        or (vstart[np.minimum(first, len(vstart) - 1)] != starts).any()
        or vlen.max() > _MAX_VARINT
        or (counts % 2).any()
    ):
        return _parse_general(serialized)
    # Each byte's 7 bits shifted into place; a varint's value is the sum of its bytes',
    # taken from a running sum (exact modulo 2**64, so wrapping does not matter).
    began = np.zeros(len(buf), np.int64)
    began[vstart] = vstart
    within = np.arange(len(buf)) - np.maximum.accumulate(began)
    groups = (buf & 0x7F).astype(np.uint64) << (within * 7).astype(np.uint64)
    running = np.cumsum(groups, dtype=np.uint64)
    values = running[vend] - np.concatenate(([np.uint64(0)], running[vend[:-1]]))
    tags, vals = values[0::2], values[1::2]  # ids start at even varints: counts are even
    if ((tags & np.uint64(7)) != 0).any():
        return _parse_general(serialized)
    owner = np.repeat(np.arange(n), counts // 2)
    field = (tags >> np.uint64(3)).astype(np.int64)
    out = {name: np.full(n, default, np.int64) for name, default in _DEFAULTS.items()}
    for number, name in _FIELDS.items():
        hit = field == number
        out[name][owner[hit]] = vals[hit].view(np.int64)
        if number <= 2 and np.bincount(owner[hit], minlength=n).min() == 0:
            raise ValueError("a message id lacks its ledger or entry id")
    return MessageIdParts(**out)


def _parse_general(serialized: Sequence[bytes]) -> MessageIdParts:
    """Any well-formed ids, one protobuf field of every id per pass (slower: ~1.5 µs an id)."""
    n = len(serialized)
    out = {name: np.full(n, default, np.int64) for name, default in _DEFAULTS.items()}
    if n == 0:
        return MessageIdParts(**out)
    lengths = np.fromiter(map(len, serialized), np.int64, n)
    ends = np.cumsum(lengths)
    cursor = ends - lengths
    # Padded for two varints read from an id's last byte on (a tag, then its value).
    buf = np.frombuffer(b"".join(serialized) + bytes(2 * _MAX_VARINT), np.uint8)
    rows = np.arange(n)
    required = np.zeros((2, n), np.bool_)  # ledger and entry id seen
    while True:
        open_ = cursor < ends
        if not open_.any():
            break
        rows_o, at = rows[open_], cursor[open_]
        tags, tag_len = _varints(buf, at)
        at = at + tag_len
        if (at > ends[open_]).any():
            raise ValueError("a message id's last tag runs past its bytes")
        wire = (tags & np.uint64(7)).astype(np.int64)
        field = (tags >> np.uint64(3)).astype(np.int64)
        step = np.zeros(len(at), np.int64)
        value = np.zeros(len(at), np.uint64)
        varint = wire == 0
        delimited = wire == 2
        needs_varint = varint | delimited
        if needs_varint.any():
            v, v_len = _varints(buf, at[needs_varint])
            value[needs_varint] = v
            step[needs_varint] = v_len
            sizes = v[delimited[needs_varint]]
            room = (ends[open_] - at)[delimited]
            if (sizes > room.astype(np.uint64)).any():
                raise ValueError("a message id's field is longer than its bytes")
            step[delimited] += sizes.astype(np.int64)
        step[wire == 1] = 8
        step[wire == 5] = 4
        if not (varint | delimited | (wire == 1) | (wire == 5)).all():
            raise ValueError("a message id has a field of an unknown wire type")
        for number, name in _FIELDS.items():
            hit = varint & (field == number)
            if hit.any():
                out[name][rows_o[hit]] = value[hit].view(np.int64)
                if number <= 2:
                    required[number - 1, rows_o[hit]] = True
        cursor[open_] = at + step
    if (cursor != ends).any():
        raise ValueError("a message id's last field runs past its bytes")
    if not required.all():
        raise ValueError("a message id lacks its ledger or entry id")
    return MessageIdParts(**out)
