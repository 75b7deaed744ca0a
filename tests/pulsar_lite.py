"""A pulsar-lite broker (Pulsar protocol, embedded) on a free loopback port.

Its metrics listener would bind 0.0.0.0:8080; the config file written here turns it
off, so nothing listens beyond 127.0.0.1. Stopped by process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from thalweg.embedded import free_port


def pulsar_lite_binary() -> str:
    import pulsar_lite

    return str(Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite")


class PulsarLite:
    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"pulsar://127.0.0.1:{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        config = data_dir / "pulsar-lite.toml"
        config.write_text("[metrics]\nenabled = false\n")
        log = data_dir / "pulsar-lite.log"
        self._proc = subprocess.Popen(
            [
                pulsar_lite_binary(),
                "--config",
                str(config),
                "--addr",
                f"127.0.0.1:{self.port}",
                "--db-path",
                str(data_dir / "db"),
                "--log-level",
                "warn",
            ],
            stdout=open(log, "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self._proc.poll() is None, log.read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("pulsar-lite did not start")

    def stop(self) -> None:
        try:
            group = os.getpgid(self._proc.pid)
        except ProcessLookupError:
            return
        os.killpg(group, signal.SIGTERM)
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            self._proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
