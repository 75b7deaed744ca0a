"""Reserved room for retention: a small file beside the lanes, given up when the disk is
so full that retention could not otherwise make room.

Retention deletes files only after it has raised the partition's floor durably (a small
JSON file written and renamed; ``lane.retention``). On a disk full to its last block
that write is refused, so retention could never delete anything: the gateway would wait
for an operator although its own limits say which files may go. The ballast (CockroachDB
keeps an "emergency ballast" for the same reason) is deleted to let the floor be
written, and laid down again as soon as files were removed, before the waiting segment
writes take the room back.

64 KiB: a floor file and its temp take two blocks; the rest is margin for a directory
that has to grow. Nothing else may use it — a segment write that got it would leave
retention stuck again.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from thalweg.lane.durable import ensure_dir
from thalweg.lane.layout import RETENTION_DIR

log = logging.getLogger(__name__)

BALLAST_BYTES = 64 * 1024
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)  # a full disk, or the user's quota reached
T = TypeVar("T")


class Ballast:
    """The reserved file under ``<root>/retention/``."""

    def __init__(self, root: Path, nbytes: int = BALLAST_BYTES) -> None:
        self.path = root / RETENTION_DIR / "ballast"
        self.nbytes = nbytes

    @property
    def laid(self) -> bool:
        try:
            return self.path.stat().st_size >= self.nbytes
        except OSError:
            return False

    def lay(self) -> bool:
        """Reserve the room (durably) unless it already is; False when it could not be
        reserved now (tried again at the next call; retention runs on without it)."""
        if self.laid:
            return True
        try:
            ensure_dir(self.path.parent)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                # Not zeros: a compressing file system (ZFS, btrfs) would store none.
                view = memoryview(os.urandom(self.nbytes))
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.path.unlink(missing_ok=True)  # a part of it would only mislead
            if exc.errno not in _NO_ROOM:
                log.warning("retention ballast %s not laid: %s", self.path, exc)
            return False
        return True

    def release(self) -> bool:
        """Give the room back to the disk; False when there was none reserved."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True

    def with_room(self, what: str, write: Callable[[], T]) -> T:
        """``write()``; if the disk refuses it for want of space, release the ballast and
        try once more (the error stands when there is no ballast to release)."""
        try:
            return write()
        except OSError as exc:
            if exc.errno not in _NO_ROOM or not self.release():
                raise
        log.warning(
            "disk full: released the %d KiB retention ballast (%s) to %s",
            self.nbytes // 1024,
            self.path,
            what,
        )
        return write()
