"""CSV and TSV: a header, quote-aware records, and a record the parser refuses
becoming a broken row instead of failing its neighbours.
"""

from __future__ import annotations

import csv as pycsv
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs

from thalweg.errors import InvariantError
from thalweg.records.file_rows import BrokenRow
from thalweg.sources.files.formats import base
from thalweg.sources.files.formats.base import (
    Chunk,
    _block_size,
    _from_row,
    _no_rows,
    _numbered,
    _one_by_one,
    _open,
)
from thalweg.sources.files.formats.records import (
    _BOM,
    _bom_kept,
    _first_record_end,
    _quotes,
    _record_end,
    _Records,
    split_records,
)
from thalweg.sources.files.lane_ready import unique_names
from thalweg.sources.files.quotes import count_holds, ends_inside_quotes


@dataclass(frozen=True, slots=True)
class CsvOptions:
    """How CSV files are split into fields (``tsv`` files use a tab).

    ``quote`` is the quote character ("": none, a quote is an ordinary character); a
    quote inside a quoted value is doubled, as RFC 4180 has it (backslash escapes are
    not read: the record cuts count quotes). ``null_values``: the cells read as null,
    in every column, strings too; None keeps pyarrow's list (``""``, ``NULL``, ``NA``,
    ``N/A``, ``null``, ``NaN`` …), which leaves string columns as written.
    """

    delimiter: str = ","
    header: bool = True
    quote: str = '"'
    null_values: tuple[str, ...] | None = None

    @property
    def quote_byte(self) -> int | None:
        """The quote as the record splitter takes it (None: no quoting)."""
        return ord(self.quote) if self.quote else None

    @property
    def delim_byte(self) -> int:
        return ord(self.delimiter)

    def parse_options(
        self, invalid_row_handler: Callable[[Any], str] | None = None
    ) -> pacsv.ParseOptions:
        return pacsv.ParseOptions(
            delimiter=self.delimiter,
            quote_char=self.quote or False,
            newlines_in_values=bool(self.quote),
            invalid_row_handler=invalid_row_handler,
        )

    def convert_options(self, types: dict[str, pa.DataType]) -> pacsv.ConvertOptions:
        if self.null_values is None:
            return pacsv.ConvertOptions(column_types=types)
        return pacsv.ConvertOptions(
            column_types=types, null_values=list(self.null_values), strings_can_be_null=True
        )

    def fields(self, line: str) -> list[str]:
        """The fields of one record's text, split as the parser splits them."""
        if self.quote:
            return next(pycsv.reader([line], delimiter=self.delimiter, quotechar=self.quote), [])
        return next(pycsv.reader([line], delimiter=self.delimiter, quoting=pycsv.QUOTE_NONE), [])


def _bodies(
    raw: pa.NativeFile, f: pa.NativeFile, quote: int | None, delim: int, carry: bytes = b""
) -> Iterator[tuple[bytes, int]]:
    """The stream cut at record ends about every ``base.CHUNK_BYTES``, with the file bytes
    each piece took.

    The cut counts quotes before newlines. When that finds no record end in more than a
    piece (a quote inside an unquoted field turned the count, lines end in a lone
    carriage return, or one value is that long), the buffer is read as the parser reads
    it: a stray quote costs one slow pass, not the rest of the file held in memory and
    copied on every read. ``carry``: the file's first bytes, read before (its byte-order
    mark left out)."""
    read = 0
    walk_at = 2 * base.CHUNK_BYTES  # doubled after each walk that finds no end: linear in all
    # Bytes read since the last cut, in which the count found no record end, and their
    # quotes: a new read is looked at alone, and joined to them once per piece (joining
    # on every read copied an unclosed value's bytes again and again).
    pending: list[bytes] = []
    size = before = 0
    head = carry
    while True:
        data = f.read(base.CHUNK_BYTES)
        data, head = (head + data if head else data), b""
        if not data:  # eof: the rest is the last piece
            if size:
                yield b"".join(pending), raw.tell() - read
            return
        end = _record_end(data, quote, before)
        if end:
            buf, cut = b"".join([*pending, data]), size + end
        elif size + len(data) >= walk_at:
            buf = b"".join([*pending, data])
            cut = split_records(buf, quote, False, delim=delim).consumed
            walk_at = 2 * base.CHUNK_BYTES if cut else 2 * len(buf)
        else:
            pending.append(data)
            size += len(data)
            before += _quotes(data, quote)
            continue
        if cut:
            pos = raw.tell()
            yield buf[:cut], pos - read
            read = pos
        rest = buf[cut:]
        pending, size, before = ([rest] if rest else []), len(rest), _quotes(rest, quote)


def _csv_header(
    body: bytes, opts: CsvOptions, eof: bool = True
) -> tuple[list[str] | None, bytes] | None:
    """The column names and the rest of the first piece (names None: no record in it;
    None: the first record goes on past the piece, wanting the next — not at ``eof``)."""
    end = body.find(b"\n")
    quote = opts.quote.encode()
    line = body[:end].rstrip(b"\r")
    simple = end > 0 and (not quote or quote not in line) and b"\r" not in line
    if opts.header and simple and line.strip():
        return unique_names(opts.fields(line.decode("utf-8", "replace"))), body[end + 1 :]
    # Quoted names (pyarrow's and pandas' writers quote them): the first record ends at
    # the first newline after an even number of quotes. Split only up to it, not the
    # whole piece (8 MiB of a quoted file: 30 ms).
    q, d = opts.quote_byte, opts.delim_byte
    first_end = _first_record_end(body, quote)
    recs = split_records(body[:first_end], q, True, delim=d)
    if len(recs.starts) > 1:  # lines that end in a lone carriage return
        first_end = int(recs.starts[1])
    # Read the piece as the parser does when the walk could have been misled: by a
    # quote inside an unquoted name (the count ended the record in the wrong place) or
    # by lone carriage returns (it took a line of records for a blank one).
    exact = not len(recs.starts) and first_end < len(body)
    if q is not None and len(recs.starts):
        arr = np.frombuffer(body, dtype=np.uint8, count=first_end)
        quotes = np.flatnonzero(arr == q)
        exact = bool(len(quotes)) and not count_holds(arr, quotes, d)
    if exact:
        recs = split_records(body, q, eof, delim=d)
        if not len(recs.starts):
            return (None, b"") if eof or recs.consumed == len(body) else None
        first_end = int(recs.starts[1]) if len(recs.starts) > 1 else recs.consumed
    if not len(recs.starts):
        return None, b""
    first = recs.text(0).decode("utf-8", "replace")
    cells = opts.fields(first)
    if not opts.header:
        return [f"f{i}" for i in range(len(cells))], body
    return unique_names(cells), body[first_end:]


def _csv(fs: pafs.FileSystem, path: str, start: int, opts: CsvOptions) -> Iterator[Chunk]:
    """Pieces of about ``base.CHUNK_BYTES`` cut at record ends, each parsed whole by pyarrow
    (on every core); a piece holding a row that does not parse is parsed again the
    careful way — split into records here, each refused one located — so only its
    rows pay for it. The first piece's types hold for the rest of the file.

    A piece whose end the quote count misplaced (see :mod:`.quotes`) gives its rows up
    to the last record end the parser sees and hands the rest on to the next piece, so
    rows and their numbers do not depend on where pieces are cut."""
    names: list[str] | None = None
    types: dict[str, pa.DataType] = {}
    row = 0
    held = b""
    raw, f = _open(fs, path)

    def rows_of(body: bytes, nbytes: int, eof: bool) -> Iterator[Chunk]:
        nonlocal row, held
        if names is None:
            raise InvariantError("names is not set")
        chunk, n, held = _csv_piece(body, names, types, opts, row, eof)
        for fld in chunk.table.schema:  # rows skipped on a resumed read type the file too
            if not pa.types.is_null(fld.type):
                types.setdefault(fld.name, fld.type)
        if row + n > start:
            chunk = _from_row(chunk, start) if row < start else chunk
            chunk.nbytes = nbytes
            yield chunk
        row += n

    with raw, f:
        head = f.read(len(_BOM))  # the file's byte-order mark marks the file: not data
        held_bytes = 0
        for piece, took in _bodies(
            raw, f, opts.quote_byte, opts.delim_byte, head.removeprefix(_BOM)
        ):
            body, held = (held + piece if held else piece), b""
            nbytes, held_bytes = took + held_bytes, 0
            if names is None:
                header = _csv_header(body, opts, eof=False)
                if header is None:  # the header goes on into the next piece
                    held, held_bytes = body, nbytes
                    continue
                names, body = header
                if names is None:
                    continue
            yield from rows_of(body, nbytes, False)
        if held and names is None:
            header = _csv_header(held, opts)
            if header is None:
                raise InvariantError("header is not set")
            names, held = header
        if held and names is not None:
            yield from rows_of(held, 0, True)


def _csv_piece(
    body: bytes,
    names: list[str],
    types: dict[str, pa.DataType],
    opts: CsvOptions,
    row: int,
    eof: bool,
) -> tuple[Chunk, int, bytes]:
    """The rows of one piece numbered from ``row``, how many, and the bytes held for
    the next piece: a tail after the last record end the parser sees (none at
    ``eof``)."""
    q = opts.quote_byte
    try:
        table = _parse_whole(body, names, types, opts)
    except pa.ArrowInvalid:
        recs = split_records(body, q, eof, delim=opts.delim_byte)
        return _parse_csv(recs, 0, names, types, opts, row), len(recs.starts), body[recs.consumed :]
    if not eof and q is not None and not _one_row_per_line(table, body, q, opts.delim_byte):
        # Values hold line breaks, or there are blank lines: check that the piece ends
        # where the parser ends a record (pyarrow takes a value still open at the end
        # without a word).
        end = split_records(body, q, False, delim=opts.delim_byte).consumed
        if end < len(body):
            chunk, n, _ = _csv_piece(body[:end], names, types, opts, row, True)
            return chunk, n, body[end:]
    return _numbered(table, row), table.num_rows, b""


def _one_row_per_line(table: pa.Table, body: bytes, quote: int, delim: int) -> bool:
    """Whether every line of ``body`` is one of ``table``'s rows, each record ending at
    its line's end. With no lone carriage return (a line end the newline count does not
    see), as many rows as lines leaves one way to be wrong: the last line opens a value
    the end of the piece leaves open (its newline inside it), which a walk over that
    line's quotes tells."""
    arr = np.frombuffer(body, dtype=np.uint8)
    crs = int(np.count_nonzero(arr == 13))
    if crs and crs != body.count(b"\r\n"):  # lone carriage returns end records too
        return False
    newlines = int(np.count_nonzero(arr == 10))
    if table.num_rows != newlines + (not body.endswith(b"\n")):
        return False
    last = body[body.rfind(b"\n", 0, len(body) - 1) + 1 :]
    return not ends_inside_quotes(last, quote, delim)


def _parse_whole(
    body: bytes, names: list[str], types: dict[str, pa.DataType], opts: CsvOptions
) -> pa.Table:
    if len(body) < 4096 and not body.strip(b"\r\n"):  # blank lines only: no rows
        return _no_rows(names, types)
    # One block per piece: the least CPU of the settings measured (0.047 s per 8 MiB
    # against 0.073 s in 1 MiB blocks allowing newlines in values), and a block boundary
    # can never fall inside a quoted value.
    body = _bom_kept(body)
    return pacsv.read_csv(
        io.BytesIO(body),
        read_options=pacsv.ReadOptions(column_names=names, block_size=len(body) + 1),
        parse_options=opts.parse_options(),
        convert_options=opts.convert_options(types),
    )


def _parse_csv(
    recs: _Records,
    lo: int,
    names: list[str],
    types: dict[str, pa.DataType],
    opts: CsvOptions,
    base: int,
) -> Chunk:
    n = len(recs.starts)
    if n <= lo:
        return Chunk(_no_rows(names, types), np.arange(0, dtype=np.int64))
    bad: list[str] = []

    def invalid(row: Any) -> str:
        bad.append(row.text)
        return "skip"

    block = _block_size(recs, lo)

    def parse(body: bytes) -> pa.Table:
        return pacsv.read_csv(
            io.BytesIO(_bom_kept(body)),
            read_options=pacsv.ReadOptions(column_names=names, block_size=block),
            parse_options=opts.parse_options(invalid),
            convert_options=opts.convert_options(types),
        )

    body = recs.buf[recs.starts[lo] : recs.ends[n - 1]]
    ordinals = np.arange(base + lo, base + n, dtype=np.int64)
    try:
        table = parse(body)
    except pa.ArrowInvalid:
        return _one_by_one(recs, lo, ordinals, parse)
    if not bad:
        if table.num_rows != n - lo:  # the parser saw other records than the splitter
            return _one_by_one(recs, lo, ordinals, parse)
        return Chunk(table, ordinals)
    # Place each refused record by its text, in order.
    broken, good = [], np.ones(n - lo, dtype=bool)
    j = lo
    for text in bad:
        want = text.encode()
        while j < n and recs.text(j) != want:
            j += 1
        if j == n:  # not found verbatim: parse one by one instead
            return _one_by_one(recs, lo, ordinals, parse)
        good[j - lo] = False
        broken.append(BrokenRow(int(ordinals[j - lo]), want, _column_count(text, names, opts)))
        j += 1
    if table.num_rows != int(good.sum()):
        return _one_by_one(recs, lo, ordinals, parse)
    return Chunk(table, ordinals[good], broken)


def _column_count(text: str, names: list[str], opts: CsvOptions) -> str:
    try:
        got = len(opts.fields(text))
    except pycsv.Error:  # a record Python's reader refuses outright (pyarrow did too)
        return f"expected {len(names)} columns"
    return f"expected {len(names)} columns, got {got}"
