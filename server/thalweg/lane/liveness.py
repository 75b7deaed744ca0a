"""Whether a process is writing a lane now: a shared ``flock`` every writer holds.

``twg verify`` judges some findings by it. An interrupted write's temp file, a partition
the broker holds records for and the lane not yet, are a moment's state beside a running
gateway and a fault once it has stopped: nothing will finish the write or take the
records before the next start. Guessing from file ages cannot tell a gateway paused in a
long GC from one that is gone; the kernel's lock table can, and it forgets a lock
whatever way its holder ended (kill -9 included).

Every writer of a lane (``twg stream`` in any role, ``twg batch``) holds a *shared* lock
on ``raw/_running.lock`` for its life, so several roles on one ``data_dir`` hold it
together. A reader asks with a non-blocking *exclusive* lock taken and let go at once:
refused means a writer is running. A writer that starts in that instant waits for it
(its lock blocks briefly) instead of failing. The reader never creates the file: where
it is absent no writer of this version has run on the directory, and the lane is
judged as stopped.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from thalweg.lane.durable import ensure_dir

RUNNING = "_running.lock"


def running_path(root: Path) -> Path:
    return Path(root) / "raw" / RUNNING


def hold_running(root: Path) -> int:
    """Take the shared lock for this process's life; the descriptor that holds it
    (closed by the process's end, however it ends)."""
    path = running_path(root)
    ensure_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)  # blocks only for a reader's instant
    return fd


def writer_running(root: Path) -> bool:
    """True when some process holds the lane's running lock now (a gateway or a batch
    run is writing); False when none does, or none of this version ever ran here."""
    try:
        fd = os.open(running_path(root), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing lets go of a lock it took
    return False
