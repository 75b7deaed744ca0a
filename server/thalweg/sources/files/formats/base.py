"""What every file reader shares: the chunk they yield (typed rows and their row
numbers), opening a possibly compressed file, and parsing records one by one when a
block of them fails.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.fs as pafs

from thalweg.errors import ThalwegError
from thalweg.records.file_rows import BrokenRow
from thalweg.sources.files.formats.records import _Records

log = logging.getLogger(__name__)


CHUNK_BYTES = 8 * 1024 * 1024  # line formats: bytes parsed per call (pyarrow splits them)

CHUNK_ROWS = 64 * 1024  # columnar formats: rows per batch

PARSE_BLOCK = 1024 * 1024  # a parser block: pyarrow parses blocks on all cores


class FileReadError(ThalwegError):
    """A file (or the rest of it) cannot be read; the rows before the damage stand."""


@dataclass(slots=True)
class Chunk:
    """Consecutive rows of one file: the ones that parsed, typed, and the ones that did
    not; ``nbytes`` is how much of the file they took (for progress)."""

    table: pa.Table
    rows: npt.NDArray[np.int64]
    broken: list[BrokenRow] = field(default_factory=list)
    nbytes: int = 0

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows) + len(self.broken)


_CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", ".lz4": "lz4"}


def _open(fs: pafs.FileSystem, path: str) -> tuple[pa.NativeFile, pa.NativeFile]:
    """The file (random access: its position is the bytes read so far) and the stream
    to read, decompressed by suffix."""
    raw = fs.open_input_file(path)
    codec = next((c for suffix, c in _CODECS.items() if path.lower().endswith(suffix)), None)
    return raw, (pa.CompressedInputStream(raw, codec) if codec else raw)


def _numbered(table: pa.Table, first: int, nbytes: int = 0) -> Chunk:
    rows = np.arange(first, first + table.num_rows, dtype=np.int64)
    return Chunk(table, rows, nbytes=nbytes)


def _from_row(chunk: Chunk, start: int) -> Chunk:
    """``chunk`` without its rows numbered below ``start`` (a resumed read)."""
    keep = chunk.rows >= start
    return Chunk(
        chunk.table.filter(pa.array(keep)),
        chunk.rows[keep],
        [b for b in chunk.broken if b.row >= start],
    )


def _block_size(recs: _Records, lo: int) -> int:
    """A parser block for the records from ``lo`` on: ``PARSE_BLOCK``, or more when a
    record is longer (pyarrow refuses a row that straddles two blocks)."""
    longest = int((recs.ends[lo:] - recs.starts[lo:]).max()) if len(recs.starts) > lo else 0
    return max(PARSE_BLOCK, longest + 2)


def _no_rows(names: list[str], types: dict[str, pa.DataType]) -> pa.Table:
    return pa.table({n: pa.array([], types.get(n, pa.null())) for n in names})


def _one_by_one(
    recs: _Records, lo: int, ordinals: npt.NDArray[np.int64], parse: Callable[[bytes], pa.Table]
) -> Chunk:
    """The records of a piece that failed as a whole, bisected: a half that parses to
    one row per record is taken whole, a record that fails alone is a broken row with
    the parser's message — a few bad rows cost a few dozen parses, not one per row."""
    tables: list[pa.Table] = []
    good: list[npt.NDArray[np.int64]] = []
    broken: list[BrokenRow] = []

    def walk(a: int, b: int) -> None:
        body = b"\n".join(recs.text(lo + k) for k in range(a, b))
        try:
            t = parse(body)
            if t.num_rows == b - a:
                tables.append(t)
                good.append(ordinals[a:b])
                return
            why = "not one row"
        except pa.ArrowInvalid as exc:  # "... in row 0": the row of a one-row parse
            why = re.sub(r" in row 0$", "", str(exc))
        if b - a == 1:
            broken.append(BrokenRow(int(ordinals[a]), recs.text(lo + a), why))
            return
        mid = (a + b) // 2
        walk(a, mid)
        walk(mid, b)

    if len(ordinals):
        walk(0, len(ordinals))
    table = pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})
    rows = np.concatenate(good) if good else np.array([], dtype=np.int64)
    return Chunk(table, rows.astype(np.int64), broken)
