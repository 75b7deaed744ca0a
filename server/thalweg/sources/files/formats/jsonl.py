"""JSON lines: one object a line, parsed a chunk at a time against the file's schema."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.json as pajson

from thalweg.sources.files.formats import base
from thalweg.sources.files.formats.base import (
    Chunk,
    FileReadError,
    _block_size,
    _from_row,
    _one_by_one,
)
from thalweg.sources.files.formats.records import _Records, split_records


def _json_lines(fs: pafs.FileSystem, path: str) -> Iterator[tuple[_Records, int]]:
    """Complete JSON lines of the file (a line of spaces is blank), ``base.CHUNK_BYTES`` at a
    time, with the bytes each chunk consumed."""
    with fs.open_input_stream(path, compression="detect") as f:
        buf = b""
        while True:
            data = f.read(base.CHUNK_BYTES)
            eof = not data
            buf += data
            recs = split_records(buf, None, eof, spaces_blank=True)
            if len(recs.starts) or recs.consumed:
                yield recs, recs.consumed
            buf = buf[recs.consumed :]
            if eof:
                return


def _jsonl(fs: pafs.FileSystem, path: str, start: int) -> Iterator[Chunk]:
    schema: pa.Schema | None = None
    row = 0
    for recs, nbytes in _json_lines(fs, path):
        n = len(recs.starts)
        if row == 0 and n and recs.text(0).lstrip(b"\xef\xbb\xbf \t").startswith(b"["):
            raise FileReadError(
                f"{path}: a JSON array, not JSON lines (one object per line); convert it, "
                f"e.g. jq -c '.[]' {path.rsplit('/', 1)[-1]} > rows.jsonl"
            )
        lo = max(0, start - row)
        # A piece is parsed whole even when a resumed read starts inside it, and the
        # first piece even when it starts later: types come from the same rows as in
        # the whole read (the file's first rows; a piece's own for a widened field).
        if n and (lo < n or schema is None):
            ordinals = np.arange(row, row + n, dtype=np.int64)

            def parse(
                body: bytes,
                schema: pa.Schema | None = schema,
                block: int = _block_size(recs, 0),
            ) -> pa.Table:
                return pajson.read_json(
                    io.BytesIO(body),
                    read_options=pajson.ReadOptions(block_size=block),
                    parse_options=pajson.ParseOptions(
                        explicit_schema=schema, unexpected_field_behavior="infer"
                    ),
                )

            # The lines as they lie in the buffer (blank ones between are skipped by
            # the parser; a count that differs sends the chunk line by line).
            body = recs.buf[recs.starts[0] : recs.ends[n - 1]]
            try:
                chunk = Chunk(_whole(parse, body, n, schema), ordinals)
            except pa.ArrowInvalid:
                chunk = _one_by_one(recs, 0, ordinals, parse)
            if schema is None and chunk.table.num_columns:
                keep = [f for f in chunk.table.schema if not pa.types.is_null(f.type)]
                schema = pa.schema(keep) if keep else None
            if lo < n:
                chunk = _from_row(chunk, start) if lo else chunk
                chunk.nbytes = nbytes
                yield chunk
        row += n


def _whole(
    parse: Callable[..., pa.Table], body: bytes, n: int, schema: pa.Schema | None
) -> pa.Table:
    """A JSON-lines chunk parsed at once: against the file's schema so far, or — a field
    that widened (an integer field with a fraction) — inferred afresh when the two
    still unify; ``ArrowInvalid`` when neither holds every line as one object."""
    try:
        table = parse(body)
    except pa.ArrowInvalid:
        if schema is None:
            raise
        table = parse(body, None)
        try:
            pa.unify_schemas([schema, table.schema], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise pa.ArrowInvalid(str(exc)) from exc
    if table.num_rows != n:
        raise pa.ArrowInvalid("a line holds more or fewer than one object")
    return table
