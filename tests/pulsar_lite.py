"""A pulsar-lite broker (Pulsar protocol, embedded) on a free loopback port.

Its metrics listener would bind 0.0.0.0:8080; the config file written here turns it
off, so nothing listens beyond 127.0.0.1. Stopped by process group.
"""

from __future__ import annotations

from pathlib import Path

from tests.services import start_service, stop_group
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
        cmd = [
            pulsar_lite_binary(),
            "--config", str(config),
            "--addr", f"127.0.0.1:{self.port}",
            "--db-path", str(data_dir / "db"),
            "--log-level", "warn",
        ]  # fmt: skip
        self._proc = start_service(cmd, data_dir / "pulsar-lite.log", self.port)

    def stop(self) -> None:
        stop_group(self._proc)
