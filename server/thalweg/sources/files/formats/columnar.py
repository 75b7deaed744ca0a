"""Parquet, Arrow IPC and spreadsheets: files that arrive typed, read in row batches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from thalweg.sources.files.formats.base import CHUNK_ROWS, Chunk, FileReadError, _numbered


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
