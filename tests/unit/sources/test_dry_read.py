"""``twg batch --dry-run``'s read (``sources/files/dry_read.py``): every file's rows as
raw-lane batches, the way a run cuts them, a file that cannot be read named and the
next one read, and nothing written."""

from __future__ import annotations

from pathlib import Path

from thalweg.config.sources import FilesSourceConfig
from thalweg.records.columns import MetadataColumns
from thalweg.sources.files.dry_read import DryRead


def test_every_file_is_read_and_a_broken_one_is_named(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("n,s\n1,x\n2,y\n")
    (tmp_path / "b.jsonl").write_text('{"n": 3}\n{"n": 4}\n{"n": 5}\n')
    (tmp_path / "c.parquet").write_bytes(b"not parquet at all")
    (tmp_path / "d.unknown").write_text("?")
    cfg = FilesSourceConfig(
        name="f", kind="files", topics=["t"], paths=[str(tmp_path / "*")], state_dir=tmp_path
    )
    read = DryRead(cfg, MetadataColumns())
    assert len(read.inputs) == 4
    steps = list(read)
    rows = {s.uri.rsplit("/", 1)[1]: 0 for s in steps}
    for s in steps:
        if s.raw is not None:
            rows[s.uri.rsplit("/", 1)[1]] += s.raw.num_rows
    assert rows == {"a.csv": 2, "b.jsonl": 3, "c.parquet": 0, "d.unknown": 0}
    done = {s.uri.rsplit("/", 1)[1] for s in steps if s.done}
    failed = {s.uri.rsplit("/", 1)[1]: s.error for s in steps if s.error}
    assert done == {"a.csv", "b.jsonl"}
    assert set(failed) == {"c.parquet", "d.unknown"} and failed["d.unknown"] == "unknown format"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.csv", "b.jsonl", "c.parquet", "d.unknown",
    ]  # fmt: skip
