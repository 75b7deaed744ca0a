"""Kafka Connect's JSON schema wrapper, cut before parsing (``envelope = "debezium"``).

Kafka Connect's JsonConverter with ``schemas.enable = true`` (Debezium's default) writes
every event as ``{"schema": <the schema>, "payload": <the event>}``. The envelope reads
only ``payload`` — the row's types come from its values — yet the schema is most of
each event's bytes (three quarters for a three-column table), and parsing it was most
of the decode: an event of a three-column table decoded 6.6x faster without it.

Every event of one table and schema version carries the same schema bytes, so the
wrapper learns the prefix ``{"schema":<schema>,"payload":`` from the first event that
has one (checking with a JSON parser that the schema is one complete value followed by
``,"payload":``) and rewrites each event that starts with exactly those bytes to
``{"payload":<the rest>``: the same document without its schema. An event with another
schema (the table changed) teaches another prefix; one without a wrapper, with a schema
that is not JSON, or written with other spacing, is left as it came and parsed whole.
The raw lane keeps the bytes as they came: only the decoder's input changes.
"""

from __future__ import annotations

import functools
import json

import pyarrow as pa
import pyarrow.compute as pc

_WRAPPED = b'{"schema":'
_PAYLOAD = b',"payload":'
_BARE = b'{"payload":'
_LONGEST = 2**31 - 1  # a slice's end past any value's length


class SchemaWrapper:
    """Cuts the schema of JsonConverter-wrapped events (module docstring); keeps the
    ``KEEP`` prefixes seen last, so a topic that interleaves a few schemas (a router of
    several tables, a schema change rolling out) is cut throughout."""

    KEEP = 8

    def __init__(self) -> None:
        self._prefixes: list[bytes] = []  # the most recently learnt last

    def unwrap(self, values: pa.Array) -> pa.Array:
        """``values`` with every event that starts with a learnt prefix rewritten to
        ``{"payload":…}``; the others as they are (nulls stay null)."""
        if not _bytes_like(values.type) or not len(values):
            return values
        wrapped = pc.fill_null(pc.starts_with(values, pattern=_WRAPPED), False)
        if not pc.any(wrapped).as_py():
            return values
        cuts = [(p, _starts(values, p)) for p in self._prefixes]
        for _ in range(self.KEEP):  # learn from the first wrapped event nothing cuts
            uncut = functools.reduce(
                lambda left, cut: pc.and_(left, pc.invert(cut[1])), cuts, wrapped
            )
            first = pc.index(uncut, True).as_py()
            prefix = None if first < 0 else _prefix_of(values[first].as_py())
            if prefix is None:
                break
            self._prefixes = [*self._prefixes, prefix][-self.KEEP :]
            cuts = [*cuts, (prefix, _starts(values, prefix))][-self.KEEP :]
        out = values
        for prefix, cut in cuts:  # a row starts with one prefix at most
            if pc.any(cut).as_py():
                rest = pc.binary_slice(values, len(prefix), _LONGEST)
                head, none = pa.scalar(_BARE, values.type), pa.scalar(b"", values.type)
                out = pc.if_else(cut, pc.binary_join_element_wise(head, rest, none), out)
        return out


def _starts(values: pa.Array, prefix: bytes) -> pa.Array:
    return pc.fill_null(pc.starts_with(values, pattern=prefix), False)


def _prefix_of(raw: bytes) -> bytes | None:
    """``{"schema":<schema>,"payload":`` of ``raw`` when its schema is one complete JSON
    value followed directly by ``,"payload":``; else None."""
    # Latin-1 maps each byte to one character, so the parser's index is a byte offset.
    text = raw.decode("latin-1")
    try:
        _, end = json.JSONDecoder().raw_decode(text, len(_WRAPPED))
    except (ValueError, RecursionError):
        return None
    if not raw.startswith(_PAYLOAD, end):
        return None
    return raw[: end + len(_PAYLOAD)]


def _bytes_like(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))
