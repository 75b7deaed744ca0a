"""Avro container files: natively where pyarrow can, else fastavro record by record."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, cast

import pyarrow as pa
import pyarrow.fs as pafs

from thalweg.sources.files.formats.base import _CODECS, CHUNK_ROWS, Chunk, FileReadError, _numbered

log = logging.getLogger(__name__)


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
