"""Bounds on what records can do to a lane schema: the defence against schema bombs.

One valid JSON record with 100,000 keys used to make every later decoded segment
100,010 columns wide (ingest fell to 0-60 rec/s, RSS to 5 GB, and the pinned schema
brought it back after a restart). :class:`SchemaLimits` bounds

* ``max_columns`` — fields of the lane schema, counted at every depth (a struct's
  children and a list of structs' children count; Elasticsearch's ``total_fields``);
* ``max_depth`` — levels of nested objects and arrays, the record itself being level 1
  (``{"a": 1}`` is 1, ``{"a": [{"b": 1}]}`` is 3);
* ``max_name_length`` — characters of one field name;
* ``max_new_fields_per_batch`` — fields one decoded batch may add to the lane.

A record beyond them is refused with ``schema_limit`` and the lane schema stays as it
was. The checks are on schemas (a handful of fields, once per batch, and only when the
batch widened the lane) plus, for JSON, a vectorised pre-screen that keeps rows the
parser must never see — a 100k-key object costs pyarrow's reader ~2 s, a 100,000-deep
array crashes it (recursion) — away from it: only long rows are counted at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

# The JSON parser recurses per nesting level: up to this depth it stays cheap (a few ms
# for one row), so rows with fewer brackets than this are not scanned before parsing;
# the schema check after parsing still holds them to max_depth.
PARSER_SAFE_DEPTH = 256
# The shortest JSON member is 4 bytes (`"":0`), so a row of L bytes has at most L/4 keys.
_MIN_MEMBER_BYTES = 4
_SCAN_BYTES = 8 << 20  # the exact scan works on at most this many bytes at a time
_BLOCK = 1024  # bytes per block of the pre-screen's cheap upper bound
_COUNT_SLICE = 256 * _BLOCK  # bytes the pre-screen compares at a time


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """What one batch may do to a lane schema (``[sources.schema_limits]``)."""

    max_columns: int = 1000
    max_depth: int = 32
    max_name_length: int = 256
    max_new_fields_per_batch: int = 500


@dataclass(frozen=True, slots=True)
class Shape:
    """A schema as the limits see it: every field's path, and the nesting depth."""

    paths: frozenset[tuple[str, ...]]
    depth: int

    @classmethod
    def of(cls, schema: pa.Schema) -> Shape:
        paths: set[tuple[str, ...]] = set()
        depth = 0
        for f in schema:
            paths.add((f.name,))
            depth = max(depth, 1 + _walk(f.type, (f.name,), paths))
        return cls(frozenset(paths), depth)


EMPTY = Shape(frozenset(), 0)
_MARKERS = ("[]", "{key}", "{value}")  # path steps that are not field names


def _walk(t: pa.DataType, prefix: tuple[str, ...], out: set[tuple[str, ...]]) -> int:
    """Add the named fields under ``t`` to ``out``; the container depth of ``t``."""
    if pa.types.is_struct(t) or pa.types.is_union(t):
        deepest = 0
        for i in range(t.num_fields):
            child = t.field(i)
            path = (*prefix, child.name)
            out.add(path)
            deepest = max(deepest, _walk(child.type, path, out))
        return 1 + deepest
    if pa.types.is_map(t):
        key = _walk(t.key_type, (*prefix, "{key}"), out)
        item = _walk(t.item_type, (*prefix, "{value}"), out)
        return 1 + max(key, item)
    if pa.types.is_dictionary(t):
        return _walk(t.value_type, prefix, out)
    if t.num_fields:  # list, large_list, fixed_size_list, list_view
        return 1 + max(_walk(t.field(i).type, (*prefix, "[]"), out) for i in range(t.num_fields))
    return 0


def check(
    limits: SchemaLimits, lane: Shape, widened: pa.Schema | Shape, *, per_batch: bool = True
) -> str | None:
    """Why ``widened`` may not become the lane schema, or None when it may.

    Args:
        lane: the lane schema when the batch began (new fields are counted from it).
        widened: the lane schema the batch (or the part of it admitted so far) would
            leave.
        per_batch: apply ``max_new_fields_per_batch`` (off for a whole schema).

    Only what is new is judged: a lane that is already past a limit (pinned from
    segments written before the limit existed) keeps decoding records that add nothing.
    """
    shape = widened if isinstance(widened, Shape) else Shape.of(widened)
    new = shape.paths - lane.paths
    if not new and shape.depth <= max(lane.depth, limits.max_depth):
        return None
    if new and len(shape.paths) > limits.max_columns:
        return (
            f"the lane schema would have {len(shape.paths)} fields, over max_columns "
            f"({limits.max_columns}); new fields include {_name(min(new))!r}"
        )
    if shape.depth > max(lane.depth, limits.max_depth):
        return f"nesting depth {shape.depth} exceeds max_depth ({limits.max_depth})"
    long = [p[-1] for p in new if p[-1] not in _MARKERS and len(p[-1]) > limits.max_name_length]
    if long:
        name = min(long)
        return (
            f"a field name of {len(name)} characters ({name[:32]!r}...) exceeds "
            f"max_name_length ({limits.max_name_length})"
        )
    if per_batch and len(new) > limits.max_new_fields_per_batch:
        return (
            f"{len(new)} new fields in one batch, over max_new_fields_per_batch "
            f"({limits.max_new_fields_per_batch})"
        )
    return None


def new_path_rows(
    table: pa.Table, known: frozenset[tuple[str, ...]]
) -> dict[tuple[str, ...], npt.NDArray[np.bool_]]:
    """For every field path of ``table`` that is not in ``known``: which rows hold a
    value for it (at any depth: a struct's child where the struct and the child are
    set, a list's struct element's child mapped back to the row of its list).
    Vectorised per field, never per row."""
    out: dict[tuple[str, ...], npt.NDArray[np.bool_]] = {}
    rows = np.arange(table.num_rows)
    for name in table.column_names:
        col = table.column(name)
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        valid = np.asarray(arr.is_valid())
        _visit(arr, (name,), rows, valid, known, out, table.num_rows)
    return out


def _visit(
    arr: pa.Array,
    path: tuple[str, ...],
    rows: npt.NDArray[np.int64],
    valid: npt.NDArray[np.bool_],
    known: frozenset[tuple[str, ...]],
    out: dict[tuple[str, ...], npt.NDArray[np.bool_]],
    n: int,
) -> None:
    """``arr`` (its elements belong to ``rows``, set where ``valid``) is the value of
    field ``path``: mark it when new, else look inside."""
    if path[-1] not in _MARKERS and path not in known:  # new, and so is all inside it
        mask = out.setdefault(path, np.zeros(n, dtype=bool))
        mask[rows[valid]] = True
    t = arr.type
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            child = arr.field(i)
            both = valid & np.asarray(child.is_valid())
            _visit(child, (*path, t.field(i).name), rows, both, known, out, n)
    elif pa.types.is_map(t):
        parents = np.asarray(pc.list_parent_indices(arr))
        for step, child in (("{key}", arr.keys), ("{value}", arr.items)):
            inner = valid[parents] & np.asarray(child.is_valid())
            _visit(child, (*path, step), rows[parents], inner, known, out, n)
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        parents = np.asarray(pc.list_parent_indices(arr))
        child = arr.flatten()
        inner = valid[parents] & np.asarray(child.is_valid())
        _visit(child, (*path, "[]"), rows[parents], inner, known, out, n)


def depth_of(t: pa.DataType) -> int:
    """Levels of objects and arrays inside a value of type ``t`` (0 for a scalar)."""
    return _walk(t, (), set())


def _name(path: tuple[str, ...]) -> str:
    return ".".join(path)


def check_schema(limits: SchemaLimits, schema: pa.Schema) -> str | None:
    """Why ``schema`` (a registry schema, a put's columns) is beyond the limits on its
    own, or None. The per-batch bound on new fields does not apply to a whole schema."""
    return check(limits, EMPTY, schema, per_batch=False)


# -- the JSON pre-screen -----------------------------------------------------------------


def prescreen_json(
    values: pa.Array, lengths: npt.NDArray[np.int64], limits: SchemaLimits
) -> dict[int, str]:
    """Rows of ``values`` (binary JSON payloads) that must not reach the parser, with
    why: nested deeper than ``max_depth`` or holding more than ``max_columns`` distinct
    fields. Exact, string-aware and vectorised; rows too short to break a limit cost
    nothing, and only rows a byte count flags are scanned.
    """
    depth_gate = max(limits.max_depth, PARSER_SAFE_DEPTH)
    width_gate = limits.max_columns
    # A row needs more than depth_gate brackets to be that deep, more than width_gate
    # members to be that wide (4 bytes each at least): shorter rows are never counted.
    deep_rows = np.flatnonzero(lengths > depth_gate)
    wide_rows = np.flatnonzero(lengths > _MIN_MEMBER_BYTES * width_gate)
    if not len(deep_rows) and not len(wide_rows):
        return {}
    flagged: set[int] = set()
    for long, chars, gate in ((deep_rows, b"{[", depth_gate), (wide_rows, b":", width_gate)):
        if not len(long):
            continue
        rows = long[_bound_counts(values, chars, long) > gate]  # cheap, an upper bound
        if len(rows):  # the few rows it cannot clear: counted exactly
            some = values.take(pa.array(rows))
            exact = sum(np.asarray(pc.count_substring(some, chr(c)).fill_null(0)) for c in chars)
            flagged.update(int(r) for r in rows[exact > gate])
    if not flagged:
        return {}
    rows = np.array(sorted(flagged), dtype=np.int64)
    depth, members = scan_json(values.take(pa.array(rows)))
    out: dict[int, str] = {}
    for row, d, m in zip(rows, depth, members, strict=True):
        if d > limits.max_depth:
            out[int(row)] = f"nesting depth {int(d)} exceeds max_depth ({limits.max_depth})"
        elif m > width_gate:  # many members: count the distinct fields (rare, exact)
            why = _distinct_fields(values[int(row)].as_py(), limits)
            if why is not None:
                out[int(row)] = why
    return out


def _bound_counts(
    values: pa.Array, chars: bytes, rows: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """For each of ``rows``, an upper bound of how many of its bytes are in ``chars``:
    the count over the 1 KiB blocks of the data buffer that the row touches. Three
    vectorised passes over the bytes (compare, per-block count, prefix sum over blocks)
    and none per row; a row is counted exactly only when its blocks hold more."""
    offsets_buf, data_buf = values.buffers()[1:3]
    width = np.int64 if pa.types.is_large_binary(values.type) else np.int32
    offsets = np.frombuffer(offsets_buf, width)[values.offset : values.offset + len(values) + 1]
    lo, hi = int(offsets[0]), int(offsets[-1])
    if data_buf is None or hi <= lo:
        return np.zeros(len(rows), np.int64)
    data = np.frombuffer(data_buf, np.uint8)[lo:hi]
    # A slice at a time (a whole number of blocks): temporaries the size of a batch's
    # bytes fault in fresh pages on every call, and cost more than the counting.
    blocks = np.concatenate(
        [
            _block_counts(data[at : at + _COUNT_SLICE], chars)
            for at in range(0, len(data), _COUNT_SLICE)
        ]
    )
    prefix = np.concatenate([[0], np.cumsum(blocks, dtype=np.int64)])
    starts = offsets[rows].astype(np.int64) - lo
    ends = offsets[rows + 1].astype(np.int64) - lo
    out: npt.NDArray[np.int64] = prefix[(ends - 1) // _BLOCK + 1] - prefix[starts // _BLOCK]
    return out


def _block_counts(data: npt.NDArray[np.uint8], chars: bytes) -> npt.NDArray[np.int64]:
    """How many bytes of each ``_BLOCK`` of ``data`` are in ``chars`` (the last block may
    be short)."""
    if chars == b"{[":
        hits = (data | 0x20) == 0x7B  # '[' is 0x5B, '{' 0x7B: one compare finds both
    else:
        hits = data == chars[0]
        for c in chars[1:]:
            hits |= data == c
    whole = len(hits) - len(hits) % _BLOCK
    words = np.packbits(hits[:whole]).view(np.uint64)  # popcounts of 64-byte words
    blocks: npt.NDArray[np.int64] = (
        np.bitwise_count(words).reshape(-1, _BLOCK // 64).sum(axis=1, dtype=np.int64)
    )
    if whole < len(hits):
        blocks = np.append(blocks, np.count_nonzero(hits[whole:]))
    return blocks


def _distinct_fields(payload: bytes, limits: SchemaLimits) -> str | None:
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return None  # not JSON: the parser reports it
    paths: set[tuple[str, ...]] = set()
    stack: list[tuple[object, tuple[str, ...]]] = [(doc, ())]
    while stack:
        node, prefix = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                path = (*prefix, k)
                paths.add(path)
                if len(paths) > limits.max_columns:
                    return (
                        f"a record with more than {limits.max_columns} distinct fields, over "
                        f"max_columns ({limits.max_columns})"
                    )
                stack.append((v, path))
        elif isinstance(node, list):
            stack.extend((v, (*prefix, "[]")) for v in node)
    return None


def scan_json(values: pa.Array) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per row of ``values`` (binary, no nulls): the nesting depth and the number of
    object members (colons outside strings), string- and escape-aware, in numpy."""
    n = len(values)
    depth = np.zeros(n, np.int64)
    members = np.zeros(n, np.int64)
    lengths = np.asarray(pc.binary_length(values).fill_null(0), dtype=np.int64)
    start = 0
    while start < n:
        stop, size = start, 0
        while stop < n and (stop == start or size + lengths[stop] <= _SCAN_BYTES):
            size += int(lengths[stop])
            stop += 1
        d, m = _scan(values.slice(start, stop - start))
        depth[start:stop], members[start:stop] = d, m
        start = stop
    return depth, members


_QUOTE, _BACKSLASH, _OPEN, _CLOSE, _COLON = 1, 2, 3, 4, 5
_CLASS = np.zeros(256, np.uint8)
_CLASS[ord('"')] = _QUOTE
_CLASS[ord("\\")] = _BACKSLASH
_CLASS[[ord("{"), ord("[")]] = _OPEN
_CLASS[[ord("}"), ord("]")]] = _CLOSE
_CLASS[ord(":")] = _COLON


def _scan(values: pa.Array) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """:func:`scan_json` on one chunk. Works on the structural bytes only (quotes,
    backslashes, brackets, colons: a fraction of a payload), every row on its own."""
    n = len(values)
    depth = np.zeros(n, np.int64)
    members = np.zeros(n, np.int64)
    joined = pc.binary_join(pa.ListArray.from_arrays([0, n], values), b"")
    data = np.frombuffer(joined[0].as_buffer(), dtype=np.uint8)
    classes = _CLASS[data]
    at = np.flatnonzero(classes)
    if not len(at):
        return depth, members
    kind = classes[at]
    lengths = np.asarray(pc.binary_length(values).fill_null(0), dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    row = np.searchsorted(starts, at, side="right") - 1
    idx = np.arange(len(at))
    new_row = np.ones(len(at), dtype=bool)
    new_row[1:] = row[1:] != row[:-1]
    # A quote is escaped when an odd run of backslashes right before it (in its row)
    # escapes it; runs are counted on the structural bytes, contiguous positions only.
    backslash = kind == _BACKSLASH
    follows = np.zeros(len(at), dtype=bool)
    follows[1:] = (at[1:] == at[:-1] + 1) & backslash[:-1] & ~new_row[1:]
    quote = kind == _QUOTE
    if backslash.any():
        run_start = np.maximum.accumulate(np.where(backslash & ~follows, idx, 0))
        run = idx - run_start + 1
        escaped = np.zeros(len(at), dtype=bool)
        escaped[1:] = follows[1:] & (run[:-1] % 2 == 1)
        quote &= ~escaped
    # Inside a string when an odd number of (unescaped) quotes of the row precede it.
    before = np.cumsum(quote) - quote
    outside = (_per_row(before, new_row) % 2) == 0
    step = np.where(outside & (kind == _OPEN), 1, 0) - np.where(outside & (kind == _CLOSE), 1, 0)
    level = _per_row(np.cumsum(step) - step, new_row) + step
    first = np.flatnonzero(new_row)
    rows = row[first]
    depth[rows] = np.maximum.reduceat(level, first)
    members[rows] = np.add.reduceat((outside & (kind == _COLON)).astype(np.int64), first)
    return depth, members


def _per_row(
    prefix: npt.NDArray[np.int64], new_row: npt.NDArray[np.bool_]
) -> npt.NDArray[np.int64]:
    """An exclusive running sum restarted at every row: ``prefix`` minus its value at
    the first event of the row."""
    base = np.where(new_row, prefix, 0)
    first_of_row = np.maximum.accumulate(np.where(new_row, np.arange(len(prefix)), 0))
    out: npt.NDArray[np.int64] = prefix - base[first_of_row]
    return out
