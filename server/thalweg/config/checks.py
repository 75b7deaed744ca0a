"""Start-up checks of the host a configuration runs on, each answered as one line that
names the setting and the cause (``twg`` prints it and exits 2).

:func:`data_dir_problem` only looks (``twg config validate`` runs it);
:func:`listen_problem` binds the address for a moment and lets it go, so the gateway
runs it just before it starts to listen, and never ``validate``.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path


def data_dir_problem(data_dir: Path) -> str | None:
    """Why ``gateway.data_dir`` cannot hold the lanes, as far as can be seen without
    writing; None when nothing is visibly wrong (a directory that does not exist yet is
    created at start, where a failure is reported the same way)."""
    path = Path(data_dir)
    if not path.exists():
        parent = next((p for p in path.parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            return f"gateway.data_dir: {path} cannot be created: {parent} is not a directory"
        return None
    if not path.is_dir():
        return f"gateway.data_dir: {path} is not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"gateway.data_dir: {path} is not writable ({_why_unwritable(path)})"
    return None


def data_dir_error(data_dir: Path, exc: OSError) -> str:
    """One line for a failure to create or write under ``gateway.data_dir``."""
    where = exc.filename or data_dir
    return f"gateway.data_dir: cannot write to {where}: {exc.strerror or exc}"


def _why_unwritable(path: Path) -> str:
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "permission denied"


def split_listen(address: str) -> tuple[str, int]:
    """``grpc://host:port`` or ``host:port`` → (host, port); IPv6 brackets removed."""
    rest = address.partition("://")[2] or address
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


def listen_problem(setting: str, address: str) -> str | None:
    """Why the gateway could not listen on ``address`` (the value of ``setting``), found
    by binding it for a moment; None when it can be bound (or the port is 0)."""
    host, port = split_listen(address)
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"{setting}: cannot resolve host {host!r} ({exc.strerror})"
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"{setting}: {host}:{port} is already in use (another process listens there)"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"{setting}: no network interface here has the address {host}"
            if exc.errno == errno.EACCES:
                return f"{setting}: not allowed to listen on port {port} (below 1024?)"
            return f"{setting}: cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None
