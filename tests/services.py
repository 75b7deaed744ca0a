"""Start a test service in its own process group, wait for its port, stop the group.

Brokers started through wrapper scripts (noida-db) leave their real binary as a child,
which a signal to the wrapper alone would orphan; a process group takes both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def start_service(
    cmd: list[str], log: Path, port: int, timeout: float = 30.0
) -> subprocess.Popen[bytes]:
    """Run ``cmd`` (output appended to ``log``) until 127.0.0.1:``port`` accepts."""
    proc = subprocess.Popen(
        cmd,
        stdout=open(log, "ab"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    stop_group(proc)
    raise RuntimeError(f"{cmd[0]} did not listen on {port} within {timeout:g}s")


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the whole process group, SIGKILL what is left after 10 s."""
    try:
        group = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    os.killpg(group, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(group, signal.SIGKILL)
        proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)  # any child still in the group
