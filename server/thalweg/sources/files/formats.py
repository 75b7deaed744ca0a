"""Read one file as chunks of typed rows with their row numbers — natively, no Python per
row on the way (Avro container files excepted: fastavro decodes records one by one).

A row number is the 0-based index of a data row in its file: after a CSV header, not
counting blank lines, counting rows that did not parse. Line formats (CSV, JSON lines)
are split into records here — quote-aware for CSV, with numpy over the bytes — so every
record has a number and its own bytes, and a record the parser refuses becomes a
:class:`~thalweg.records.file_rows.BrokenRow` instead of failing its neighbours. A file
that cannot be read on (a truncated Parquet footer, a damaged Avro block, a CSV value
of a type its column cannot take in a chunk no record of which parses alone) raises
:class:`FileReadError` after the chunks before the damage.

Its length: every format's reader is here with the byte-level record cutter they share;
issue 36 makes it a package (a name → reader table, one module per format).
"""

from __future__ import annotations

import csv as pycsv
import io
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from thalweg.errors import InvariantError, ThalwegError
from thalweg.records.file_rows import BrokenRow
from thalweg.sources.files.lane_ready import UnstorableColumnsError, lane_ready, unique_names
from thalweg.sources.files.quotes import count_holds, ends_inside_quotes, newlines_inside

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 * 1024 * 1024  # line formats: bytes parsed per call (pyarrow splits them)
CHUNK_ROWS = 64 * 1024  # columnar formats: rows per batch
PARSE_BLOCK = 1024 * 1024  # a parser block: pyarrow parses blocks on all cores

FORMATS = ("parquet", "csv", "tsv", "jsonl", "avro", "arrow", "excel")
_SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".avro": "avro",
    ".arrow": "arrow",
    ".arrows": "arrow",
    ".ipc": "arrow",
    ".feather": "arrow",
    ".xlsx": "excel",
    ".xlsm": "excel",
    ".xlsb": "excel",
    ".xls": "excel",
    ".ods": "excel",
}
_COMPRESSED = (".gz", ".bz2", ".zst", ".zstd", ".lz4")


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


def detect(path: str) -> str | None:
    """The format named by a path's suffix (a compression suffix looked through)."""
    name = path.lower()
    for suffix in _COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    dot = name.rfind(".")
    return _SUFFIXES.get(name[dot:]) if dot >= 0 else None


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


def read_chunks(
    fs: pafs.FileSystem, path: str, fmt: str, start: int = 0, csv: CsvOptions | None = None
) -> Iterator[Chunk]:
    """The rows of ``path`` from row number ``start`` on, chunk by chunk.

    Raises:
        FileReadError: the file cannot be opened, or cannot be read past some row.
    """
    readers: dict[str, Callable[[], Iterator[Chunk]]] = {
        "parquet": lambda: _parquet(fs, path, start),
        "arrow": lambda: _arrow(fs, path, start),
        "csv": lambda: _csv(fs, path, start, csv or CsvOptions()),
        "tsv": lambda: _csv(fs, path, start, replace(csv or CsvOptions(), delimiter="\t")),
        "jsonl": lambda: _jsonl(fs, path, start),
        "avro": lambda: _avro(fs, path, start),
        "excel": lambda: _excel(fs, path, start),
    }
    checked: set[pa.Schema] = set()
    try:
        for chunk in readers[fmt]():
            chunk.table = lane_ready(chunk.table, checked)
            yield chunk
    except UnstorableColumnsError as exc:
        raise FileReadError(f"{path}: {exc}") from exc
    except FileReadError:
        raise
    except Exception as exc:  # whatever a reader library raises on a damaged file
        raise FileReadError(f"{path}: {type(exc).__name__}: {exc}") from exc


_CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd", ".lz4": "lz4"}


def _open(fs: pafs.FileSystem, path: str) -> tuple[pa.NativeFile, pa.NativeFile]:
    """The file (random access: its position is the bytes read so far) and the stream
    to read, decompressed by suffix."""
    raw = fs.open_input_file(path)
    codec = next((c for suffix, c in _CODECS.items() if path.lower().endswith(suffix)), None)
    return raw, (pa.CompressedInputStream(raw, codec) if codec else raw)


# -- columnar formats ---------------------------------------------------------------


def _numbered(table: pa.Table, first: int, nbytes: int = 0) -> Chunk:
    rows = np.arange(first, first + table.num_rows, dtype=np.int64)
    return Chunk(table, rows, nbytes=nbytes)


def _parquet(fs: pafs.FileSystem, path: str, start: int) -> Iterator[Chunk]:
    with fs.open_input_file(path) as f:
        pf = pq.ParquetFile(f)
        meta = pf.metadata
        size = f.size()
        total = max(1, meta.num_rows)
        groups: list[int] = []  # the row groups from the one holding ``start`` on
        row = 0
        for i in range(meta.num_row_groups):
            n = meta.row_group(i).num_rows
            if groups or row + n > start:
                groups.append(i)
            else:
                row += n
        if not groups:
            return
        for batch in pf.iter_batches(batch_size=CHUNK_ROWS, row_groups=groups):
            table = pa.Table.from_batches([batch])
            if row < start:
                table = table.slice(start - row)
                row = start
            yield _numbered(table, row, size * table.num_rows // total)
            row += table.num_rows


def _arrow(fs: pafs.FileSystem, path: str, start: int) -> Iterator[Chunk]:
    with fs.open_input_file(path) as f:
        size = f.size()
        try:
            reader: Any = pa.ipc.open_file(f)
            batches: Iterator[pa.RecordBatch] = (
                reader.get_batch(i) for i in range(reader.num_record_batches)
            )
        except pa.ArrowInvalid:  # not the file format: the stream format
            f.seek(0)
            batches = iter(pa.ipc.open_stream(f))
        row = 0
        for batch in batches:
            end = row + batch.num_rows
            if end > start:
                table = pa.Table.from_batches([batch]).slice(max(0, start - row))
                first = max(row, start)
                yield _numbered(table, first, size * table.num_rows // max(1, size))
            row = end


def _excel(fs: pafs.FileSystem, path: str, start: int) -> Iterator[Chunk]:
    try:
        import fastexcel
    except ImportError as exc:
        raise FileReadError(
            f"{path}: Excel files need fastexcel: pip install 'thalweg[excel]'"
        ) from exc
    with fs.open_input_stream(path) as f:
        data = f.read()
    sheet = fastexcel.read_excel(data).load_sheet(0)
    table = pa.Table.from_batches([sheet.to_arrow()])
    for first in range(start, table.num_rows, CHUNK_ROWS):
        part = table.slice(first, CHUNK_ROWS)
        yield _numbered(part, first, len(data) * part.num_rows // max(1, table.num_rows))


def _avro(fs: pafs.FileSystem, path: str, start: int) -> Iterator[Chunk]:
    """Natively (DataFusion, the streaming Avro decoder's fast path: 7x fastavro here)
    when the file is local and uncompressed; per record with fastavro otherwise, and
    from the first row not handed on when the native read fails part-way (a damaged
    block: fastavro then hands on the rows before the damage and says where it is)."""
    import fastavro

    from thalweg.codecs.avro import container_batches

    row, first = 0, start  # rows read natively; the first row not handed on
    if isinstance(fs, pafs.LocalFileSystem) and not path.lower().endswith(tuple(_CODECS)):
        try:
            with open(path, "rb") as f:
                schema = fastavro.reader(f).writer_schema
            held: list[pa.Table] = []
            for table in container_batches(path, schema):
                if row + table.num_rows > start:
                    held.append(table.slice(max(0, start - row)))
                row += table.num_rows
                if sum(t.num_rows for t in held) >= CHUNK_ROWS:
                    yield _numbered(pa.concat_tables(held), first)
                    held, first = [], row
            if held:
                yield _numbered(pa.concat_tables(held), first)
            return
        except Exception as exc:  # read per record from the first row not handed on
            log.debug("%s: native Avro read stopped at row %d (%s); per record", path, first, exc)
    yield from _avro_per_record(fs, path, first)


def _avro_per_record(fs: pafs.FileSystem, path: str, start: int) -> Iterator[Chunk]:
    import fastavro

    from thalweg.codecs.typemap import avro_record_schema

    with fs.open_input_stream(path, compression="detect") as f:
        reader = fastavro.reader(f)
        schema = avro_record_schema(reader.writer_schema)
        pending: list[dict[str, Any]] = []
        first = start
        records = enumerate(reader)
        while True:
            try:
                i, record = next(records)
            except StopIteration:
                break
            except Exception as exc:  # a damaged block: the records before it stand
                if pending:
                    yield _numbered(pa.Table.from_pylist(pending, schema=schema), first)
                raise FileReadError(
                    f"{path}: damaged after row {first + len(pending) - 1}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if i < start:
                continue
            pending.append(cast(dict[str, Any], record))
            if len(pending) == CHUNK_ROWS:
                yield _numbered(pa.Table.from_pylist(pending, schema=schema), first)
                first += len(pending)
                pending = []
        if pending:
            yield _numbered(pa.Table.from_pylist(pending, schema=schema), first)


# -- line formats ---------------------------------------------------------------------


@dataclass(slots=True)
class _Records:
    """Complete records of a byte buffer: bytes ``[starts[i], ends[i])``."""

    buf: bytes
    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    consumed: int  # bytes up to the end of the last complete record (its newline)

    def text(self, i: int) -> bytes:
        return self.buf[self.starts[i] : self.ends[i]]


def split_records(
    buf: bytes,
    quote: int | None,
    eof: bool,
    *,
    delim: int | None = None,
    spaces_blank: bool = False,
) -> _Records:
    """The newline-ended records of ``buf`` (and its tail at ``eof``), blank ones left
    out; a newline inside ``quote`` characters does not end a record (RFC 4180: an
    escaped quote is doubled, so the parity of the quotes before a newline says). Given
    ``delim`` (the delimiter: a CSV buffer), quotes the count misreads (one inside an
    unquoted field) are read as the parser reads them (:mod:`.quotes`), and a carriage
    return not followed by a newline ends a record too, as it does for the parser
    (files from classic Mac OS end lines so).

    A blank record is an empty one; with ``spaces_blank`` (JSON lines) one of only
    spaces and tabs too. A CSV line of spaces is a row: the parser reads it as one."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    ends = np.flatnonzero(arr == 10).astype(np.int64)
    if delim is not None:
        cr = np.flatnonzero(arr == 13)
        if len(cr):  # a CR that ends the buffer may yet be followed by a LF, but not at eof
            follows = arr[np.minimum(cr + 1, len(arr) - 1)]
            lone = cr[(follows != 10) & ((cr + 1 < len(arr)) | eof)]
            if len(lone):
                ends = np.union1d(ends, lone.astype(np.int64))
    quotes = np.flatnonzero(arr == quote) if quote is not None and len(ends) else ends[:0]
    if len(quotes) and delim is not None and not count_holds(arr, quotes, delim):
        ends = ends[~newlines_inside(buf, quotes, ends, delim)]
    elif len(quotes):  # a newline after an odd number of quotes is inside a value
        ends = ends[(np.searchsorted(quotes, ends) & 1) == 0]
    consumed = int(ends[-1]) + 1 if len(ends) else 0
    if eof and consumed < len(buf):
        ends = np.append(ends, len(buf))
        consumed = len(buf)
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64) if len(ends) else ends
    # Trailing carriage returns are not part of a record (CRLF files).
    if len(ends):
        cr = (ends > starts) & (arr[np.maximum(ends - 1, 0)] == 13)
        if delim is not None:  # a CSV tail still in quotes at eof keeps its last CR
            cr &= ends < len(arr)
        ends = ends - cr.astype(np.int64)
        blank = ends <= starts
        if spaces_blank:
            maybe = np.flatnonzero(~blank & np.isin(arr[np.minimum(starts, len(arr) - 1)], (9, 32)))
            for i in maybe:
                blank[i] = not buf[starts[i] : ends[i]].strip()
        starts, ends = starts[~blank], ends[~blank]
    return _Records(buf, starts, ends, consumed)


def _json_lines(fs: pafs.FileSystem, path: str) -> Iterator[tuple[_Records, int]]:
    """Complete JSON lines of the file (a line of spaces is blank), ``CHUNK_BYTES`` at a
    time, with the bytes each chunk consumed."""
    with fs.open_input_stream(path, compression="detect") as f:
        buf = b""
        while True:
            data = f.read(CHUNK_BYTES)
            eof = not data
            buf += data
            recs = split_records(buf, None, eof, spaces_blank=True)
            if len(recs.starts) or recs.consumed:
                yield recs, recs.consumed
            buf = buf[recs.consumed :]
            if eof:
                return


def _record_end(buf: bytes, quote: int | None, before: int = 0) -> int:
    """The index after the last newline of ``buf`` that ends a record (0: none does).
    ``before`` quotes came since the last record start before ``buf`` (bytes read
    before, in which no record ends), so quote parity counts from ``before``.

    One vectorised count gives the parity before the last newline (1.7 ms per 8 MiB
    piece; ``bytes.count`` took 7.5 ms and an index of every quote 6 ms); stepping back
    a line counts only that line's bytes. After a few lines (all inside one value) the
    parity of every newline is taken at once instead.
    """
    end = buf.rfind(b"\n")
    if end < 0:
        return 0
    if quote is None:
        return end + 1
    q = bytes((quote,))
    arr = np.frombuffer(buf, dtype=np.uint8)
    odd = (before + int(np.count_nonzero(arr[:end] == quote))) & 1
    for _ in range(_STEP_BACK):
        if not odd:
            return end + 1
        prev = buf.rfind(b"\n", 0, end)
        if prev < 0:
            return 0
        odd ^= buf.count(q, prev + 1, end) & 1
        end = prev
    if not odd:
        return end + 1
    newlines = np.flatnonzero(arr[:end] == 10)
    quotes = np.flatnonzero(arr[:end] == quote)
    even = newlines[((before + np.searchsorted(quotes, newlines)) & 1) == 0]
    return int(even[-1]) + 1 if len(even) else 0


_STEP_BACK = 64  # lines stepped back one by one before the vectorised search


def _bodies(
    raw: pa.NativeFile, f: pa.NativeFile, quote: int | None, delim: int, carry: bytes = b""
) -> Iterator[tuple[bytes, int]]:
    """The stream cut at record ends about every ``CHUNK_BYTES``, with the file bytes
    each piece took.

    The cut counts quotes before newlines. When that finds no record end in more than a
    piece (a quote inside an unquoted field turned the count, lines end in a lone
    carriage return, or one value is that long), the buffer is read as the parser reads
    it: a stray quote costs one slow pass, not the rest of the file held in memory and
    copied on every read. ``carry``: the file's first bytes, read before (its byte-order
    mark left out)."""
    read = 0
    walk_at = 2 * CHUNK_BYTES  # doubled after each walk that finds no end: linear in all
    # Bytes read since the last cut, in which the count found no record end, and their
    # quotes: a new read is looked at alone, and joined to them once per piece (joining
    # on every read copied an unclosed value's bytes again and again).
    pending: list[bytes] = []
    size = before = 0
    head = carry
    while True:
        data = f.read(CHUNK_BYTES)
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
            walk_at = 2 * CHUNK_BYTES if cut else 2 * len(buf)
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


def _quotes(data: bytes, quote: int | None) -> int:
    if quote is None or not data:
        return 0
    return int(np.count_nonzero(np.frombuffer(data, dtype=np.uint8) == quote))


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


def _first_record_end(body: bytes, quote: bytes = b'"') -> int:
    """The index after the first newline of ``body`` outside quotes (``quote`` empty:
    no quoting), empty lines skipped (``len(body)``: no such newline)."""
    pos, odd, blank = 0, 0, True
    while True:
        nl = body.find(b"\n", pos)
        if nl < 0:
            return len(body)
        odd ^= (body.count(quote, pos, nl) & 1) if quote else 0
        blank = blank and nl - pos <= (body[nl - 1 : nl] == b"\r")  # as split_records
        if not odd and not blank:
            return nl + 1
        pos = nl + 1


def _csv(fs: pafs.FileSystem, path: str, start: int, opts: CsvOptions) -> Iterator[Chunk]:
    """Pieces of about ``CHUNK_BYTES`` cut at record ends, each parsed whole by pyarrow
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


_BOM = b"\xef\xbb\xbf"


def _bom_kept(body: bytes) -> bytes:
    """``body`` as pyarrow must see it for a byte-order mark that starts it to stay data
    (the file's own is dropped before; one inside the file, after files were joined
    with cat, is data wherever pieces are cut): pyarrow drops a BOM that starts its
    input, so a blank line goes first — it skips those."""
    return b"\n" + body if body.startswith(_BOM) else body


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
