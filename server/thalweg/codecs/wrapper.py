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

import json
import math

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

_WRAPPED = b'{"schema":'
_PAYLOAD = b',"payload":'
_BARE = b'{"payload":'
_LONGEST = 2**31 - 1  # a slice's end past any value's length


class SchemaWrapper:
    """Cuts the schema of JsonConverter-wrapped events (module docstring).

    Whether an event is cut depends on its own bytes alone — a schema that is one strict
    JSON value followed directly by ``,"payload":`` — never on the batch it came in: the
    prefixes learnt are only a cache of that decision (the ``KEEP`` seen last), and an
    event no cached prefix cuts is looked at itself. A replay or a rebuilt decoded lane
    therefore decodes every event as ingest did.
    """

    KEEP = 8

    def __init__(self) -> None:
        self._prefixes: list[bytes] = []  # the most recently learnt last

    def unwrap(self, values: pa.Array) -> tuple[pa.Array, npt.NDArray[np.bool_]]:
        """``values`` with every event whose schema can be cut rewritten to
        ``{"payload":…}``, the others as they are (nulls stay null); and which were cut."""
        cut = np.zeros(len(values), dtype=bool)
        if not _bytes_like(values.type) or not len(values):
            return values, cut
        wrapped = _starts(values, _WRAPPED)
        if not wrapped.any():
            return values, cut
        cuts = [(p, _starts(values, p)) for p in self._prefixes]
        for _, mask in cuts:
            cut |= mask
        pending = wrapped & ~cut
        while pending.any():  # once per schema not cached; an event that has none: once
            first = int(np.argmax(pending))
            prefix = _prefix_of(values[first].as_py())
            if prefix is None:
                pending[first] = False  # parsed as it came
                continue
            mask = _starts(values, prefix)
            cuts.append((prefix, mask))
            cut |= mask
            pending &= ~mask
            self._prefixes = [*(p for p in self._prefixes if p != prefix), prefix][-self.KEEP :]
        out = values
        for prefix, mask in cuts:  # a row starts with one prefix at most
            if mask.any():
                rest = pc.binary_slice(values, len(prefix), _LONGEST)
                head, none = pa.scalar(_BARE, values.type), pa.scalar(b"", values.type)
                joined = pc.binary_join_element_wise(head, rest, none)
                out = pc.if_else(pa.array(mask), joined, out)
        return out, cut


def _starts(values: pa.Array, prefix: bytes) -> npt.NDArray[np.bool_]:
    return np.asarray(pc.fill_null(pc.starts_with(values, pattern=prefix), False))


def _prefix_of(raw: bytes) -> bytes | None:
    """``{"schema":<schema>,"payload":`` of ``raw`` when its schema is one strict JSON
    value (UTF-8, no key twice in an object, no number a double cannot hold, no lone
    surrogate: what the Arrow reader would refuse in the whole event) followed directly
    by ``,"payload":``; else None."""
    # Latin-1 maps each byte to one character, so the parser's index is a byte offset.
    text = raw.decode("latin-1")
    try:
        _, end = json.JSONDecoder().raw_decode(text, len(_WRAPPED))
        schema = raw[len(_WRAPPED) : end]
        doc = json.loads(
            schema.decode("utf-8"),
            object_pairs_hook=_no_key_twice,
            parse_float=_finite,
            parse_constant=_no_constant,
        )
        if b"\\u" in schema:  # json takes a lone escaped surrogate; UTF-8 cannot hold it
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError):  # UnicodeError is a ValueError
        return None
    if not raw.startswith(_PAYLOAD, end):
        return None
    return raw[: end + len(_PAYLOAD)]


def _no_key_twice(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key twice in one object")
    return dict(pairs)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite double")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not JSON")


def _bytes_like(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))
