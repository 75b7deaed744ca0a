"""Debezium's unavailable-value placeholder → a null and the column's name in
``__unavailable``.

A Postgres connector cannot read a TOASTed column that an update did not change (the
WAL does not carry it under ``REPLICA IDENTITY DEFAULT``); Debezium then sends the
placeholder ``__debezium_unavailable_value`` (the connector's
``unavailable.value.placeholder``) in its place: as text in a text column, as the
placeholder's bytes in a bytea column (base64 text in JSON), and as an array of that one
element in an array column. Landed as it came, the placeholder would overwrite the value
the table holds: the fault peers' sinks have.

So the decoded lane never holds it: the cell becomes null and ``__unavailable`` (a list
of column names, null when the source sent every value) names it. An upsert sink keeps
the key's current value of those columns (the flush's earlier row, or the table's
row), and the latest view the key's last value in the lane (``records/unavailable.py``,
``docs/cdc.md``). Work is on whole columns, with no per-row Python.
"""

from __future__ import annotations

import base64

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.records.unavailable import PLACEHOLDER, UNAVAILABLE, names_per_row

__all__ = ["PLACEHOLDER", "UNAVAILABLE", "set_aside"]


def set_aside(rows: dict[str, pa.Array], placeholder: str, n: int) -> dict[str, pa.Array]:
    """``rows`` (the row image's columns) with each placeholder cell null and an
    ``__unavailable`` column naming them; ``rows`` as they are when none has one."""
    text = {placeholder, base64.b64encode(placeholder.encode()).decode("ascii")}
    marks = {}
    for name, column in rows.items():
        mask = _placeholder(column, text, placeholder.encode(), n)
        if mask is not None and mask.any():
            marks[name] = mask
    if not marks:
        return rows
    out = dict(rows)
    for name, mask in marks.items():
        column = rows[name]
        out[name] = pc.if_else(pa.array(mask), pa.nulls(n, column.type), column)
    out[UNAVAILABLE] = names_per_row(marks, n)
    return out


def _placeholder(column: pa.Array, text: set[str], raw: bytes, n: int) -> np.ndarray | None:
    """Which cells of ``column`` are the placeholder (None for a type that cannot be)."""
    t = column.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        found = pc.is_in(column, pa.array(sorted(text), t))
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        found = pc.equal(column, pa.scalar(raw, t))
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        # An array of the placeholder alone: one element, and that the placeholder.
        values = column.flatten()
        inner = _placeholder(values, text, raw, len(values))
        if inner is None:
            return None
        parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
        hits = np.bincount(parents[inner], minlength=n)
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
        return np.asarray((hits == 1) & (lengths == 1))
    else:
        return None
    return np.asarray(pc.fill_null(found, False).to_numpy(zero_copy_only=False), dtype=bool)
