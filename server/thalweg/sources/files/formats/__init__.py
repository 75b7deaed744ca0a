"""Read one file as chunks of typed rows with their row numbers — natively, no Python per
row on the way (Avro container files excepted: fastavro decodes records one by one).

A row number is the 0-based index of a data row in its file: after a CSV header, not
counting blank lines, counting rows that did not parse. A record the parser refuses
becomes a :class:`~thalweg.records.file_rows.BrokenRow` instead of failing its
neighbours. A file that cannot be read on (a truncated Parquet footer, a damaged Avro
block, a CSV value of a type its column cannot take in a chunk no record of which
parses alone) raises :class:`FileReadError` after the chunks before the damage.

One module per format (``csv``, ``jsonl``, ``avro``, ``columnar``), the record cutter
they share (``records``), what every reader yields (``base``), and the name → reader
table (``table``).
"""

from thalweg.sources.files.formats.base import Chunk, FileReadError
from thalweg.sources.files.formats.csv import CsvOptions
from thalweg.sources.files.formats.table import FORMATS, detect, read_chunks

__all__ = ["FORMATS", "Chunk", "CsvOptions", "FileReadError", "detect", "read_chunks"]
