"""Which reader reads a file: a format by name or by the path's suffix, and the one
entry point, :func:`read_chunks`, that makes every reader's chunks fit for the lane.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import pyarrow as pa
import pyarrow.fs as pafs

from thalweg.sources.files.formats.avro import _avro
from thalweg.sources.files.formats.base import Chunk, FileReadError
from thalweg.sources.files.formats.columnar import _arrow, _excel, _parquet
from thalweg.sources.files.formats.csv import CsvOptions, _csv
from thalweg.sources.files.formats.jsonl import _jsonl
from thalweg.sources.files.lane_ready import UnstorableColumnsError, lane_ready

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


def detect(path: str) -> str | None:
    """The format named by a path's suffix (a compression suffix looked through)."""
    name = path.lower()
    for suffix in _COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    dot = name.rfind(".")
    return _SUFFIXES.get(name[dot:]) if dot >= 0 else None


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
