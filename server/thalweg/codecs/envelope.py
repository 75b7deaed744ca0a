"""Debezium change events → the row they describe (``envelope = "debezium"``).

A Debezium event is an envelope: ``before`` and ``after`` row images, the operation
``op`` (``c`` create, ``u`` update, ``d`` delete, ``r`` a snapshot read), the
connector's ``source`` block (its log position: a Postgres ``lsn``, a MySQL ``file`` and
``pos``…) and ``ts_ms``; as JSON with or without the ``{"schema", "payload"}`` wrapper of
the JsonConverter, or as Avro. The format's decoder reads the envelope as it is; this
wrapper turns each event into the row image — ``after``, or ``before`` for a delete —
as top-level columns, beside four columns named as Debezium's own
``ExtractNewRecordState`` names them, so the shape is the one CDC users know:

``__op``
    ``c``, ``u``, ``d`` or ``r``; ``d`` for a Kafka tombstone (a null value: the record
    key's row is gone, and no image says more).
``__deleted``
    true for a delete and a tombstone.
``__source``
    the envelope's ``source`` block as it came (typed), for ordering and audit.
``__ts_ms``
    when the connector processed the event.
``__unavailable``
    the columns whose value the connector did not send (its unavailable-value
    placeholder, which never lands: the cell is null; ``codecs/unavailable.py``); only
    where an event had one.

The order that decides which event of a key wins is the lane's position, never these
columns (``docs/cdc.md``). An event without a usable ``op``, a create, update or read
without ``after``, a truncate (``t``, which names no row) or an image with a field named
like one of the columns above is refused as ``envelope`` (the dead-letter lane, with the
reason named). Work is on whole columns: one ``if_else`` per batch, no per-row Python.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.codecs.base import ArrowDecoder, DecodeFailure, DecodeReason, DecodeResult, assemble
from thalweg.codecs.unavailable import PLACEHOLDER, UNAVAILABLE, set_aside
from thalweg.codecs.wrapper import SchemaWrapper

OP, DELETED, SOURCE, TS_MS = "__op", "__deleted", "__source", "__ts_ms"
CDC_COLUMNS = (OP, DELETED, SOURCE, TS_MS, UNAVAILABLE)
_ENVELOPE = ("before", "after", "op", "source", "ts_ms")
_OPS = ("c", "u", "d", "r")


class DebeziumEnvelope:
    """An :class:`~thalweg.codecs.base.ArrowDecoder` of Debezium events over the format's
    decoder of their envelopes.

    Args:
        inner: decodes the envelopes (JSON or Avro); its schema is the envelope's, not
            the lane's, so it starts unpinned.
        schema: the decoded lane's schema so far (rows and the ``__`` columns).
        placeholder: what the connector sends for a value it could not read (its
            ``unavailable.value.placeholder``).
    """

    def __init__(
        self,
        inner: ArrowDecoder,
        schema: pa.Schema | None = None,
        placeholder: str = PLACEHOLDER,
    ) -> None:
        self._inner = inner
        self._placeholder = placeholder
        self._schema = schema if schema is not None else pa.schema([])
        self._lock = threading.Lock()
        self._wrapper = SchemaWrapper()  # JsonConverter's schema, cut before parsing

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def decode(self, values: pa.Array) -> DecodeResult:
        with self._lock:
            return self._decode(values)

    def _decode(self, values: pa.Array) -> DecodeResult:
        unwrapped, cut = self._wrapper.unwrap(values)
        inner = self._inner.decode(unwrapped)
        n = len(values)
        env = _envelope(inner.table, n)
        failures = {f.row: f for f in inner.failures}
        if "schema" in inner.table.column_names:
            # A cut event that names "schema" again after its payload: whole, the
            # reader refuses a key twice, and so it is refused here.
            again = cut & np.asarray(inner.table.column("schema").is_valid())
            for row in np.flatnonzero(again):
                why = "the event names 'schema' twice"
                failures[int(row)] = DecodeFailure(int(row), DecodeReason.SYNTAX, why)
        decoded = np.ones(n, dtype=bool)
        decoded[list(failures)] = False
        tombstone = np.asarray(values.is_null()) & decoded
        event = decoded & ~tombstone

        ops = _ops(env["op"], n)
        before, after = _same_type(env["before"], env["after"], n)
        is_delete = ops == "d"
        image_fields = {f.name for f in after.type} if pa.types.is_struct(after.type) else set()
        clash = sorted(image_fields & set(CDC_COLUMNS))

        def refuse(mask: np.ndarray, why: str) -> None:
            for row in np.flatnonzero(mask & event):
                failures[int(row)] = DecodeFailure(int(row), DecodeReason.ENVELOPE, why)
            event[mask] = False

        refuse(ops == "t", "a truncate event names no row")
        refuse(~np.isin(ops, (*_OPS, "t")), "the event has no known 'op' (c, u, d or r)")
        refuse(
            ~is_delete & ~np.asarray(after.is_valid()), "a create, update or read without 'after'"
        )
        if clash:
            refuse(np.ones(n, dtype=bool), f"the row has a field named {clash[0]!r}")

        rows = _flatten(pc.if_else(pa.array(is_delete), before, after), n)
        rows = set_aside(rows, self._placeholder, n)
        rows[OP] = pa.array(np.where(tombstone, "d", ops), pa.string())
        rows[DELETED] = pa.array(is_delete | tombstone)
        for name, column in ((SOURCE, env["source"]), (TS_MS, env["ts_ms"])):
            if not pa.types.is_null(column.type):
                rows[name] = column
        table = pa.table(rows)
        try:
            lane = pa.unify_schemas([self._schema, table.schema], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            why = f"the row does not fit the lane schema: {exc}"
            for row in np.flatnonzero(event | tombstone):
                failures[int(row)] = DecodeFailure(int(row), DecodeReason.TYPE_CONFLICT, why)
            return assemble(n, self._schema, [], list(failures.values()))
        self._schema = lane
        kept = np.flatnonzero(event | tombstone)
        return assemble(n, lane, [(kept, table.take(kept))], list(failures.values()))


def _ops(op: pa.Array, n: int) -> np.ndarray:
    """Each event's ``op`` as text ("" where there is none or it is not text)."""
    if not pa.types.is_string(op.type) and not pa.types.is_large_string(op.type):
        return np.full(n, "", dtype=object)
    return np.asarray(op.fill_null("").to_numpy(zero_copy_only=False), dtype=object)


def _envelope(table: pa.Table, n: int) -> dict[str, pa.Array]:
    """The envelope's members as arrays, unwrapped from ``payload`` where the JSON
    converter wrapped them (``{"schema": …, "payload": {…}}``); a member no event had is
    an all-null array."""
    out: dict[str, pa.Array] = {}
    wrapped = table.column("payload").combine_chunks() if "payload" in table.column_names else None
    if wrapped is not None and not pa.types.is_struct(wrapped.type):
        wrapped = None
    for name in _ENVELOPE:
        top = (
            table.column(name).combine_chunks()
            if name in table.column_names
            else pa.nulls(n, pa.null())
        )
        if wrapped is not None and wrapped.type.get_field_index(name) >= 0:
            inside = pc.struct_field(wrapped, name)
            top, inside = _same_type(top, inside, n)
            top = pc.coalesce(inside, top)
        out[name] = top
    return out


def _same_type(a: pa.Array, b: pa.Array, n: int) -> tuple[pa.Array, pa.Array]:
    """``a`` and ``b`` cast to one type (an all-null side takes the other's)."""
    if a.type == b.type:
        return a, b
    if pa.types.is_null(a.type):
        return pa.nulls(n, b.type), b
    if pa.types.is_null(b.type):
        return a, pa.nulls(n, a.type)
    common = (
        pa.unify_schemas(
            [pa.schema([pa.field("x", a.type)]), pa.schema([pa.field("x", b.type)])],
            promote_options="permissive",
        )
        .field("x")
        .type
    )
    return a.cast(common), b.cast(common)


def _flatten(image: pa.Array, n: int) -> dict[str, pa.Array]:
    """The row image's fields as columns (none when no event had an image)."""
    if not pa.types.is_struct(image.type):
        return {}
    out = {}
    for i, field in enumerate(image.type):
        child = pc.struct_field(image, [i])
        # A null image (a delete with no 'before') leaves its fields null, whatever the
        # struct's children hold underneath.
        out[field.name] = pc.if_else(image.is_valid(), child, pa.nulls(n, child.type))
    return out
