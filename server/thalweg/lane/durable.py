"""Files that appear whole or not at all: the one durable write every lane file,
manifest, coverage file and sink file goes through.

temp file beside the target → fsync → rename (or a hard link that refuses an existing
name) → fsync of the directory. A reader never sees a half-written file under its
name, and a kill -9 leaves at most a temp file (``<name>.tmp-<pid>-<n>``) that the
file's one writer removes at its next start (:func:`remove_interrupted_writes`).
Pure filesystem: imports nothing of Thalweg.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

TMP_MARK = ".tmp-"
_temp_seq = itertools.count()


def temp_path(path: Path) -> Path:
    """A temp file beside ``path`` for one write: ``<name>.tmp-<pid>-<n>``, unique in
    the process. A pid alone is not: two writers of one file in one process — the two
    sinks of a pipeline node each materialising the node's dead-letter file — wrote the
    same temp file, and one renamed the other's away (``ENOENT`` at its rename, the sink
    degraded for a minute). Readers skip any name holding :data:`TMP_MARK`."""
    return path.with_name(f"{path.name}{TMP_MARK}{os.getpid()}-{next(_temp_seq)}")


def ensure_dir(path: Path) -> None:
    """Create ``path`` and make each newly created level durable in its parent."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        fsync_dir(d.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_interrupted_writes(path: Path) -> int:
    """Remove the temp files a killed process left beside ``path`` (``write_*_durably``
    names them ``<name>.tmp-<pid>-<n>``; a kill -9 between write and rename leaves one): the
    write they held never happened, so nothing is lost. Called by the file's one writer
    at start — another live writer's temp file would go with them. Returns how many."""
    prefix = path.name + TMP_MARK
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(prefix)]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    for name in names:
        (path.parent / name).unlink(missing_ok=True)
        log.info("removed interrupted write %s", path.parent / name)
    return len(names)


def fsync_file(path: Path) -> None:
    """Flush a file's data to the disk (its name is the directory's: :func:`fsync_dir`)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prepare(path: Path, write: Callable[[Path], object], *, fsync: bool = True) -> Path:
    """The first half of a durable write: ``write`` fills a temp file beside ``path``,
    which is then flushed; the temp file's name. Nothing is left on failure.

    Apart from :func:`publish` so a writer can do the slow half (encoding, the disk)
    before it asks whether it may still publish (a segment writer's fence).
    """
    ensure_dir(path.parent)
    tmp = temp_path(path)
    try:
        write(tmp)
        if fsync:
            fsync_file(tmp)
    except BaseException:  # a full disk, say: no temp is left
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def publish(
    tmp: Path,
    path: Path,
    *,
    exclusive: bool = False,
    fsync: bool = True,
    check: Callable[[], object] | None = None,
) -> None:
    """The second half: a prepared temp file becomes ``path`` — renamed over it, or
    with ``exclusive`` hard-linked, which refuses an existing name atomically — and the
    directory is flushed. ``check`` runs first and may raise to publish nothing. The
    temp file never outlives the call (a kill -9 aside: :func:`remove_interrupted_writes`).

    Raises:
        FileExistsError: ``exclusive`` and ``path`` exists.
    """
    try:
        if check is not None:
            check()
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    if fsync:
        fsync_dir(path.parent)


def write_file_durably(
    path: Path, write: Callable[[Path], object], *, exclusive: bool = False
) -> None:
    """Make ``path`` appear whole or not at all: :func:`prepare`, then :func:`publish`.

    Raises:
        FileExistsError: ``exclusive`` and ``path`` exists.
    """
    publish(prepare(path, write), path, exclusive=exclusive)


def write_json_durably(path: Path, body: dict[str, object]) -> None:
    """Replace ``path`` with ``body`` as JSON (the old file stands until then)."""
    text = json.dumps(body, sort_keys=True) + "\n"
    write_file_durably(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
