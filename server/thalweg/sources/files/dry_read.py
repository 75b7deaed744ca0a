"""``twg batch --dry-run``: the configured files read into raw-lane batches the way a run
reads them — the same inputs, formats, chunks and rows — with no manifest, no lane and no
lock, so the dry run sees what a run would decode and nothing is written."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from thalweg.config.models import FilesSourceConfig
from thalweg.records.columns import MetadataColumns
from thalweg.sources.files.formats import FileReadError, detect, read_chunks
from thalweg.sources.files.source import InputFile, chunk_batch, csv_options, resolve_inputs


@dataclass(frozen=True, slots=True)
class DryStep:
    """One step of a dry read of file ``uri``: a chunk's rows (``raw``, from ``nbytes``
    of the file), the file read whole (``done``), or why it cannot be (``error``: its
    reading ends there)."""

    uri: str
    raw: pa.RecordBatch | None = None
    nbytes: int = 0
    error: str | None = None
    done: bool = False


class DryRead:
    """The files of a source, resolved now; iterate for their steps, file by file."""

    def __init__(self, cfg: FilesSourceConfig, columns: MetadataColumns) -> None:
        self.cfg = cfg
        self.columns = columns
        self.inputs: list[InputFile] = resolve_inputs(cfg.paths)

    def __iter__(self) -> Iterator[DryStep]:
        cfg, topic = self.cfg, self.cfg.topics[0]
        opts = csv_options(cfg)
        for number, f in enumerate(self.inputs):
            fmt = cfg.file_format if cfg.file_format != "auto" else detect(f.path)
            if fmt is None:
                yield DryStep(f.uri, error="unknown format")
                continue
            try:
                for chunk in read_chunks(f.fs, f.path, fmt, 0, opts):
                    raw = chunk_batch(chunk, f, topic, number, cfg, self.columns)
                    yield DryStep(f.uri, raw, chunk.nbytes)
            except FileReadError as exc:
                yield DryStep(f.uri, error=str(exc))
                continue
            yield DryStep(f.uri, done=True)
