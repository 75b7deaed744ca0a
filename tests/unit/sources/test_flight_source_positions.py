"""A ``kind = "flight"`` source's positions file on a disk that refuses it: a refused
commit, as a broker's would be (the engine logs it and the next commit covers it), not
an error that stops the gateway."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from thalweg.config.models import FlightSourceConfig
from thalweg.errors import SourceError
from thalweg.group.owners import OwnerDirectory
from thalweg.records.columns import MetadataColumns
from thalweg.sources.flight import FlightSource


async def test_a_positions_file_the_disk_refuses_is_a_retriable_commit_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = FlightSourceConfig(
        kind="flight",
        name="up",
        topics=["mirror"],
        location="grpc://127.0.0.1:1",
        state_dir=tmp_path,
    )
    source = FlightSource(cfg, MetadataColumns(), OwnerDirectory())
    await source.commit({("mirror", 0): 5})

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(SourceError, match="No space left on device"):
        await source.commit({("mirror", 0): 9, ("mirror", 1): 3})
    monkeypatch.undo()
    saved = json.loads((tmp_path / "positions.json").read_text())
    assert saved["positions"] == {"0": 5}  # the file on disk as it was
    assert [f.name for f in tmp_path.iterdir() if ".tmp" in f.name] == []
    await source.commit({("mirror", 0): 10})  # space again: the next commit saves all
    saved = json.loads((tmp_path / "positions.json").read_text())
    assert saved["positions"] == {"0": 10, "1": 3}
    assert await source.committed(("mirror", 1)) == 3
