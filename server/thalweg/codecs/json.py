"""JSON payloads → Arrow with pyarrow's multithreaded JSON reader.

Why not ``json.loads`` per record: it is 12-24x slower here (PERFORMANCE-NOTES: 57 k rows/s
vs 1.35 M for ``pyarrow.json`` on newline-joined values). The cost of the fast path is that
the reader works on a whole buffer, so a bad payload fails the buffer; we then bisect to
find exactly the bad rows: the reader's "in row N" hint finds most of them with one
parse each, bisection the rest, and nothing extra is paid when all rows are good.

Why one module of ~540 lines: reading, pinning, bisecting bad rows and keeping the
schema within its limits are one algorithm over one parse — each step decides what the
next may assume about the buffer — so they stay together.

The lane schema is *pinned*: once a field has a type, later payloads are read with that
type (``explicit_schema``) and new fields are inferred and appended. A payload whose field
contradicts the pinned type fails alone with ``type_conflict``; it never changes the type
of rows already written. Numbers promote int → double (Arrow's permissive unification).

The schema grows only within :class:`~thalweg.codecs.limits.SchemaLimits`: a record that
would take it past one fails alone with ``schema_limit``. A batch that brings no new field
is parsed once, against the lane schema, with new fields an error (the common case costs
nothing more); a batch that does is parsed in chunks whose new columns times rows are
bounded, so no record — nor many records each under the limits — can make the reader
build a huge table, and rows too deep or too wide for the reader never reach it.

Its length: the block reader, its careful per-line fallback and the type-conflict
rules must agree; they are kept side by side on purpose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from thalweg.codecs.base import (
    DecodeFailure,
    DecodeReason,
    DecodeResult,
    LaneDecoder,
    assemble,
)
from thalweg.codecs.limits import (
    SchemaLimits,
    Shape,
    check,
    depth_of,
    new_path_rows,
    prescreen_json,
    scan_json,
)
from thalweg.records.columns import MetadataColumns

_MIN_BLOCK = 1 << 20
# A chunk parsed with inference (new fields possible) builds at most this many new
# cells (new columns times rows): ~40 MB at worst, whatever the rows hold.
_CHUNK_CELLS = 1 << 22
_CHUNK_ROWS = 4096  # and at most this many rows
_SCAN_CHUNK = 256
_LINE_SCAN = 256 * 1024  # bytes searched for line breaks at a time
_ROW_HINT = re.compile(r" in row (\d+)$")


@dataclass(slots=True)
class _Piece:
    rows: np.ndarray  # indices into the input
    table: pa.Table


class JsonArrowDecoder(LaneDecoder):
    """Decodes newline-free or pretty-printed JSON objects, one per payload.

    Args:
        columns: metadata column names; payload fields under its prefix are refused.
        schema: an initial pinned schema (for example loaded from the decoded lane).
        declared: ``schema`` is a declared contract (a JSON Schema): it wins over
            inference — fields it does not name are ignored and it never grows.
    """

    def __init__(
        self,
        columns: MetadataColumns,
        schema: pa.Schema | None = None,
        *,
        declared: bool = False,
        limits: SchemaLimits | None = None,
    ) -> None:
        super().__init__(columns, schema, limits)
        self._declared = declared and schema is not None
        self._start = self.shape  # the lane when the batch being decoded began

    # -- internals -------------------------------------------------------------------

    def _decode(self, values: pa.Array) -> DecodeResult:
        n = len(values)
        failures: list[DecodeFailure] = []
        stripped_len = self._stripped_lengths(values)
        present = np.asarray(values.is_valid())
        blank = present & (stripped_len == 0)
        for row in np.flatnonzero(blank):
            failures.append(DecodeFailure(int(row), DecodeReason.EMPTY, "empty payload"))
        candidates = np.flatnonzero(present & ~blank)
        # Rows the parser must never see (too deep to parse safely, too many fields):
        # refused before parsing; nothing is counted for short rows.
        bombs = prescreen_json(values, stripped_len, self._limits)
        if bombs:
            failures.extend(
                DecodeFailure(row, DecodeReason.SCHEMA_LIMIT, why) for row, why in bombs.items()
            )
            candidates = candidates[~np.isin(candidates, list(bombs))]
        flat = values
        if _has_line_breaks(values):  # JSON whitespace, but the reader splits rows on them
            flat = pc.replace_substring(values, b"\r", b" ")
            flat = pc.replace_substring(flat, b"\n", b" ")

        out: list[tuple[np.ndarray, pa.Table]] = []
        self._start = self.shape
        if self._declared:  # the schema never grows: fields it does not name are ignored
            merged, pieces, more = self._parse_rows(flat, candidates)
            failures.extend(more)
            if pieces:
                out.append((_rows_of(pieces), merged))
        else:
            failures.extend(self._parse_bounded(values, flat, candidates, out))
        return assemble(n, self._schema, out, failures)

    def _parse_bounded(
        self,
        values: pa.Array,
        flat: pa.Array,
        rows: np.ndarray,
        out: list[tuple[np.ndarray, pa.Table]],
    ) -> list[DecodeFailure]:
        """Parse ``rows`` into ``out`` without ever building more columns than the limits
        allow; the failed rows.

        A settled topic's batch parses once against the lane schema with new fields an
        error — the whole cost when nothing is new. Otherwise (a new field, or a row
        that does not parse) the rows are parsed in chunks small enough that one chunk
        cannot build a huge table (members times rows bounded, the members counted as colons),
        each widening the lane only as far as the limits allow, and as soon as the lane
        has widened the rest is tried against it again in one parse.
        """
        failures: list[DecodeFailure] = []
        retry = True
        while len(rows):
            if retry:
                table = self._closed(flat, rows)
                if table is not None:
                    out.append((rows, table))
                    break
            window = rows[:_CHUNK_ROWS]  # counted here only: a chunk is never longer
            colons = np.asarray(pc.count_substring(_take(values, window), ":").fill_null(0))
            k = self._chunk_len(colons.astype(np.int64))
            chunk, rows = rows[:k], rows[k:]
            before = self._schema
            failures.extend(self._parse_chunk(flat, chunk, out))
            retry = not self._schema.equals(before)
        return failures

    def _closed(self, flat: pa.Array, rows: np.ndarray) -> pa.Table | None:
        """``rows`` parsed against the lane schema, or None when one of them adds a field
        (or does not parse, or does not fit): nothing new is ever built here."""
        if not len(self._schema) or not len(rows):
            return None
        try:
            table = self._parse(_take(flat, rows), closed=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return None
        return table if table.num_rows == len(rows) else None

    def _chunk_len(self, colons: np.ndarray) -> int:
        """How many of the next rows (their colon counts: at least their members) make
        one chunk whose parse stays small: at most 4 times max_columns members, at most
        _CHUNK_CELLS new cells (members times rows), at most _CHUNK_ROWS rows."""
        members = np.cumsum(colons)
        rows = np.arange(1, len(colons) + 1)
        over = (members > 4 * self._limits.max_columns) | (members * rows > _CHUNK_CELLS)
        first = np.flatnonzero(over)
        return max(1, int(first[0])) if len(first) else len(colons)

    def _parse_chunk(
        self, flat: pa.Array, rows: np.ndarray, out: list[tuple[np.ndarray, pa.Table]]
    ) -> list[DecodeFailure]:
        """Parse one bounded chunk with inference, keep the rows that fit the limits and
        widen the lane by them; the failed rows."""
        failures: list[DecodeFailure] = []
        merged, pieces, more = self._parse_rows(flat, rows)
        failures.extend(more)
        for attempt in range(3):
            why = self._over_limits(merged.schema)
            if why is None:
                break
            done = {f.row for f in failures}
            refused = (
                self._admit(flat, pieces, merged, done)
                if attempt == 0
                else self._widening(pieces, merged, done, why, every=attempt == 2)
            )
            failures.extend(refused)
            failed = np.fromiter((f.row for f in failures), np.int64, len(failures))
            merged, pieces, more = self._parse_rows(flat, rows[~np.isin(rows, failed)])
            failures.extend(more)
        self._pin(merged.schema)
        if pieces:
            out.append((_rows_of(pieces), merged))
        return failures

    def _parse_rows(
        self, flat: pa.Array, rows: np.ndarray
    ) -> tuple[pa.Table, list[_Piece], list[DecodeFailure]]:
        """Parse ``rows``: the merged table (reserved fields dropped), its pieces, and the
        rows that failed."""
        pieces, failures = self._isolate(flat, rows)
        pieces, conflicts = self._fit(flat, pieces)
        failures.extend(conflicts)
        merged, reserved = self._drop_reserved(self._merge(pieces), pieces)
        failures.extend(reserved)
        return merged, pieces, failures

    def _over_limits(self, seen: pa.Schema) -> str | None:
        """Why the batch's schema ``seen`` may not become the lane's; free (one schema
        comparison) when the batch adds nothing, which is every batch of a settled topic."""
        if self._declared or seen.equals(self._schema):
            return None
        widened = _try_unify(self._schema, seen)
        if widened is None or widened.equals(self._schema):
            return None
        return check(self._limits, self._start, widened)

    def _admit(
        self, flat: pa.Array, pieces: list[_Piece], merged: pa.Table, done: set[int]
    ) -> list[DecodeFailure]:
        """The rows that take the lane past a limit, in row order: a row is kept when
        the lane widened by every row kept before it still fits. Which row holds which
        new field is read off the parsed columns (vectorised per field); only the rows
        that hold a new field are looked at one by one, and only here, when the batch
        is over a limit. Rows nested too deep are found by the exact scan."""
        rows = _rows_of(pieces)  # aligned with merged's rows
        start, limits = self._start, self._limits
        refused: dict[int, str] = {}
        allowed = max(limits.max_depth, start.depth)
        deep_cols = [f.name for f in merged.schema if 1 + depth_of(f.type) > allowed]
        if deep_cols:
            hit = np.zeros(len(rows), dtype=bool)
            for name in deep_cols:
                hit |= np.asarray(merged.column(name).is_valid())
            at = np.flatnonzero(hit)
            depth, _ = scan_json(flat.take(pa.array(rows[at])))
            for i, d in zip(at, depth, strict=True):
                if d > allowed:
                    refused[int(rows[i])] = (
                        f"nesting depth {int(d)} exceeds max_depth ({limits.max_depth})"
                    )
        masks = new_path_rows(merged, self.shape.paths)
        if masks:
            paths = list(masks)
            carries = np.stack([masks[p] for p in paths])  # path x row
            acc = set(self.shape.paths)
            for i in sorted(np.flatnonzero(carries.any(axis=0)), key=lambda i: rows[i]):
                row = int(rows[i])
                if row in done or row in refused:
                    continue
                new = [paths[j] for j in np.flatnonzero(carries[:, i]) if paths[j] not in acc]
                why = _growth(limits, start, acc, new)
                if why is None:
                    acc.update(new)
                else:
                    refused[row] = why
        return [DecodeFailure(r, DecodeReason.SCHEMA_LIMIT, why) for r, why in refused.items()]

    def _widening_rows(self, pieces: list[_Piece], merged: pa.Table, done: set[int]) -> np.ndarray:
        """The rows (ascending) that hold a value in a column the batch widened."""
        rows = np.concatenate([p.rows for p in pieces]) if pieces else np.empty(0, np.int64)
        hit = np.zeros(len(rows), dtype=bool)
        for f in merged.schema:
            i = self._schema.get_field_index(f.name)
            if i < 0 or not self._schema.field(i).type.equals(f.type):
                hit |= np.asarray(merged.column(f.name).is_valid())
        out = np.sort(rows[hit])
        return out[~np.isin(out, list(done))] if done else out

    def _widening(
        self, pieces: list[_Piece], merged: pa.Table, done: set[int], why: str, *, every: bool
    ) -> list[DecodeFailure]:
        """A fallback that never keeps the lane past a limit: refuse every row that widens
        it (or, ``every``, all rows left)."""
        if every:
            rows = np.concatenate([p.rows for p in pieces]) if pieces else np.empty(0, np.int64)
            rows = rows[~np.isin(rows, list(done))]
        else:
            rows = self._widening_rows(pieces, merged, done)
        return [DecodeFailure(int(r), DecodeReason.SCHEMA_LIMIT, why) for r in rows]

    @staticmethod
    def _stripped_lengths(values: pa.Array) -> np.ndarray:
        lengths = pc.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False)
        out: np.ndarray = lengths.astype(np.int64)
        short = np.flatnonzero((out > 0) & (out <= 64))
        if len(short):
            # Whitespace-only payloads are rare and short; check only short ones.
            short_vals = values.take(pa.array(short)).to_pylist()
            for i, v in zip(short, short_vals, strict=True):
                if not v.strip():
                    out[i] = 0
        return out

    def _explicit_schema(self) -> pa.Schema:
        if self._declared:
            return self._schema
        return pa.schema([f for f in self._schema if not _has_null(f.type)])

    def _parse(
        self, values: pa.Array, *, single_block: bool = False, closed: bool = False
    ) -> pa.Table:
        joined = pc.binary_join(pa.ListArray.from_arrays([0, len(values)], values), b"\n")
        buf = joined[0].as_buffer()
        longest = int(pc.max(pc.binary_length(values)).as_py() or 0)
        # One block makes the reader's error row numbers exact (used when isolating).
        block = len(buf) + 1 if single_block else max(_MIN_BLOCK, longest + 2, len(buf) // 2 + 1)
        return pj.read_json(
            pa.BufferReader(buf),
            read_options=pj.ReadOptions(
                block_size=block, use_threads=not single_block and len(buf) > _MIN_BLOCK
            ),
            parse_options=pj.ParseOptions(
                explicit_schema=self._schema if closed else self._explicit_schema(),
                unexpected_field_behavior="error"
                if closed
                else ("ignore" if self._declared else "infer"),
            ),
        )

    def _try(
        self, values: pa.Array, rows: np.ndarray, *, single_block: bool = False
    ) -> tuple[pa.Table | None, str | None, DecodeReason]:
        """Parse ``rows``; return the table when it holds exactly one row per payload."""
        try:
            table = self._parse(_take(values, rows), single_block=single_block)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            return None, str(exc), _classify(str(exc))
        if table.num_rows != len(rows):
            return None, f"parsed to {table.num_rows} records", DecodeReason.NOT_ONE_RECORD
        return table, None, DecodeReason.SYNTAX

    def _isolate(
        self, values: pa.Array, rows: np.ndarray
    ) -> tuple[list[_Piece], list[DecodeFailure]]:
        """Split ``rows`` into parsed pieces and per-row failures.

        The happy path is one multithreaded parse. On failure, chunks are parsed as single
        blocks so the reader's "in row N" points at the bad payload, which is confirmed by
        parsing it alone (a payload holding two objects would shift later row numbers);
        anything the hint cannot explain is bisected.
        """
        if not len(rows):
            return [], []
        table, _, _ = self._try(values, rows)
        if table is not None:
            return [_Piece(rows, table)], []
        failures: list[DecodeFailure] = []
        for chunk in np.array_split(rows, max(1, len(rows) // _SCAN_CHUNK)):
            failures.extend(self._scan(values, chunk))
        good = rows[~np.isin(rows, [f.row for f in failures])]
        if not len(good):
            return [], failures
        table, _, _ = self._try(values, good)
        if table is not None:
            return [_Piece(good, table)], failures
        pieces, more = self._bisect(values, good)  # context-dependent conflicts: rare
        return pieces, failures + more

    def _scan(self, values: pa.Array, chunk: np.ndarray) -> list[DecodeFailure]:
        failures: list[DecodeFailure] = []
        while len(chunk):
            table, error, _reason = self._try(values, chunk, single_block=True)
            if table is not None:
                break
            hint = _row_hint(error or "")
            if hint is not None and hint < len(chunk):
                alone, alone_error, alone_reason = self._try(values, chunk[hint : hint + 1])
                if alone is None:
                    failures.append(
                        DecodeFailure(int(chunk[hint]), alone_reason, alone_error or "")
                    )
                    chunk = chunk[hint + 1 :]
                    continue
            _, more = self._bisect(values, chunk)
            failures.extend(more)
            break
        return failures

    def _bisect(
        self, values: pa.Array, rows: np.ndarray
    ) -> tuple[list[_Piece], list[DecodeFailure]]:
        pieces: list[_Piece] = []
        failures: list[DecodeFailure] = []
        stack = [rows] if len(rows) else []
        while stack:
            chunk = stack.pop()
            table, error, reason = self._try(values, chunk)
            if table is not None:
                pieces.append(_Piece(chunk, table))
            elif len(chunk) == 1:
                failures.append(DecodeFailure(int(chunk[0]), reason, error or ""))
            else:
                mid = len(chunk) // 2
                stack.extend((chunk[mid:], chunk[:mid]))
        pieces.sort(key=lambda p: int(p.rows[0]))
        return pieces, failures

    def _fit(
        self, values: pa.Array, pieces: list[_Piece]
    ) -> tuple[list[_Piece], list[DecodeFailure]]:
        """Keep pieces whose inferred types unify with the lane schema.

        Only fields whose type still contains ``null`` (seen empty so far) are inferred
        rather than pinned, so a conflict here is rare; a piece that conflicts is parsed
        row by row and only the rows that contradict the schema fail.
        """
        acc = self._schema
        kept: list[_Piece] = []
        failures: list[DecodeFailure] = []
        for piece in pieces:
            widened = _try_unify(acc, piece.table.schema)
            if widened is not None:
                acc = widened
                kept.append(piece)
                continue
            for row in piece.rows:
                one = np.array([row])
                table, error, _reason = self._try(values, one)
                try:
                    if table is None:
                        raise pa.ArrowInvalid(error or "")
                    acc = _unify(acc, table.schema)
                    kept.append(_Piece(one, table))
                except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                    failures.append(DecodeFailure(int(row), DecodeReason.TYPE_CONFLICT, f"{exc}"))
        kept.sort(key=lambda p: int(p.rows[0]))
        return kept, failures

    def _merge(self, pieces: list[_Piece]) -> pa.Table:
        if not pieces:
            return self._schema.empty_table()
        tables = [self._schema.empty_table(), *(p.table for p in pieces)]
        return pa.concat_tables(tables, promote_options="permissive")

    def _drop_reserved(
        self, table: pa.Table, pieces: list[_Piece]
    ) -> tuple[pa.Table, list[DecodeFailure]]:
        reserved = [name for name in table.column_names if self._columns.is_reserved(name)]
        if not reserved:
            return table, []
        rows = np.concatenate([p.rows for p in pieces])
        failures: list[DecodeFailure] = []
        for name in reserved:
            hit = np.flatnonzero(np.asarray(table.column(name).is_valid()))
            failures.extend(
                DecodeFailure(
                    int(rows[i]),
                    DecodeReason.RESERVED_FIELD,
                    f"payload field {name!r} uses the reserved metadata prefix "
                    f"{self._columns.prefix!r}",
                )
                for i in hit
            )
        return table.drop_columns(reserved), failures

    def _pin(self, seen: pa.Schema) -> None:
        if not self._declared:
            self._schema = _unify(self._schema, seen)


def _growth(
    limits: SchemaLimits,
    start: Shape,
    lane: set[tuple[str, ...]],
    new: list[tuple[str, ...]],
) -> str | None:
    """Why a row may not add the fields ``new`` to ``lane`` (the paths kept so far), as
    :func:`~thalweg.codecs.limits.check` says it for a whole schema."""
    if not new:
        return None
    if len(lane) + len(new) > limits.max_columns:
        return (
            f"the lane schema would have {len(lane) + len(new)} fields, over max_columns "
            f"({limits.max_columns}); new fields include {'.'.join(min(new))!r}"
        )
    long = [p[-1] for p in new if len(p[-1]) > limits.max_name_length]
    if long:
        name = min(long)
        return (
            f"a field name of {len(name)} characters ({name[:32]!r}...) exceeds "
            f"max_name_length ({limits.max_name_length})"
        )
    added = len((lane | set(new)) - start.paths)
    if added > limits.max_new_fields_per_batch:
        return (
            f"{added} new fields in one batch, over max_new_fields_per_batch "
            f"({limits.max_new_fields_per_batch})"
        )
    return None


def _take(values: pa.Array, rows: np.ndarray) -> pa.Array:
    """``values`` at ``rows`` (ascending, distinct): a zero-copy slice when they are
    consecutive (a batch without blank or refused rows, or the rest of one)."""
    if len(rows) and int(rows[-1]) - int(rows[0]) + 1 == len(rows):
        return values.slice(int(rows[0]), len(rows))
    return values.take(pa.array(rows))


def _rows_of(pieces: list[_Piece]) -> np.ndarray:
    return np.concatenate([p.rows for p in pieces]) if pieces else np.empty(0, np.int64)


def _classify(message: str) -> DecodeReason:
    if "Column() changed from" in message:
        return DecodeReason.NOT_ONE_RECORD  # the payload is not a JSON object
    if "changed from" in message or message.startswith("Failed to convert JSON to"):
        return DecodeReason.TYPE_CONFLICT
    return DecodeReason.SYNTAX


def _row_hint(message: str) -> int | None:
    match = _ROW_HINT.search(message)
    return int(match.group(1)) if match else None


def _try_unify(a: pa.Schema, b: pa.Schema) -> pa.Schema | None:
    try:
        return _unify(a, b)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


def _unify(a: pa.Schema, b: pa.Schema) -> pa.Schema:
    return pa.unify_schemas([a, b], promote_options="permissive")


def _has_null(t: pa.DataType) -> bool:
    """True when ``t`` is null or nests a null (``list<null>``, ``struct<x: null>``)."""
    if pa.types.is_null(t):
        return True
    return any(_has_null(t.field(i).type) for i in range(t.num_fields))


def _has_line_breaks(values: pa.Array) -> bool:
    """Whether any value holds a CR or LF byte. A ``bytes.find`` over the values' data
    (memchr speed, a slice at a time) instead of two replace passes (0.3 µs a record,
    and far more under load) for the common case of payloads without them."""
    t = values.type
    if not (
        pa.types.is_binary(t)
        or pa.types.is_string(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_large_string(t)
    ):
        return True  # another layout: let the replace passes look
    _, offsets, data = values.buffers()[:3]
    if offsets is None or data is None or not len(values):
        return False
    width = (
        np.int64
        if pa.types.is_large_binary(values.type) or pa.types.is_large_string(values.type)
        else np.int32
    )
    bounds = np.frombuffer(offsets, width)[values.offset : values.offset + len(values) + 1]
    # In slices: one copy of a whole batch's bytes cost more than the search (a fresh
    # 90 MB allocation faults in every page: 55 ms, against 6 ms in 256 KiB slices).
    for at in range(int(bounds[0]), int(bounds[-1]), _LINE_SCAN):
        chunk = data[at : min(at + _LINE_SCAN, int(bounds[-1]))].to_pybytes()
        if b"\n" in chunk or b"\r" in chunk:
            return True
    return False
