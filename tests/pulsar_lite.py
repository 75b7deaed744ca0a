"""A pulsar-lite broker (Pulsar protocol, embedded) on a free loopback port.

Its metrics listener would bind 0.0.0.0:8080; the config file written here turns it
off, so nothing listens beyond 127.0.0.1. Stopped by process group.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from tests.services import start_service, stop_group
from thalweg.embedded import free_port


def pulsar_lite_binary() -> str:
    import pulsar_lite

    return str(Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite")


class PulsarLite:
    """pulsar-lite on loopback. ``default_partitions`` > 0 makes every new topic a
    partitioned topic of that many partitions (its only way to partition)."""

    full = False  # not a full Pulsar: regex subscriptions, chunking and seek do not work

    def __init__(
        self, data_dir: Path, port: int | None = None, default_partitions: int = 0
    ) -> None:
        self.port = port or free_port()
        self.url = f"pulsar://127.0.0.1:{self.port}"
        self.default_partitions = default_partitions
        data_dir.mkdir(parents=True, exist_ok=True)
        config = data_dir / "pulsar-lite.toml"
        config.write_text(
            f"default_partitions = {default_partitions}\n[metrics]\nenabled = false\n"
        )
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


class ExternalPulsar:
    """A full Pulsar named by ``THALWEG_PULSAR_URL`` (and ``THALWEG_PULSAR_ADMIN_URL`` for
    creating partitioned topics): the tests pulsar-lite cannot serve run against it."""

    full = True

    def __init__(self, url: str, admin_url: str | None) -> None:
        self.url = url
        self.admin_url = admin_url

    def create_partitioned(self, topic: str, partitions: int) -> None:
        import urllib.request

        if self.admin_url is None:
            raise RuntimeError("set THALWEG_PULSAR_ADMIN_URL to create partitioned topics")
        req = urllib.request.Request(
            f"{self.admin_url}/admin/v2/persistent/public/default/{topic}/partitions",
            data=str(partitions).encode(),
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=10).close()

    def stop(self) -> None:
        """Not ours to stop."""


def drain_subscription(
    url: str,
    topic: str,
    subscription: str,
    kind: str = "failover",
    *,
    wait_ms: int = 2000,
    limit: int | None = None,
) -> list[bytes]:
    """The payloads still unacknowledged on ``subscription`` of ``public/default/topic``:
    received until ``wait_ms`` passes without one (or ``limit`` arrived), never
    acknowledged."""
    import pulsar

    from thalweg.pulsar.client import CONSUMER_TYPES

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    out: list[bytes] = []
    try:
        consumer = client.subscribe(
            f"persistent://public/default/{topic}", subscription, consumer_type=CONSUMER_TYPES[kind]
        )
        with contextlib.suppress(pulsar.Timeout):
            while limit is None or len(out) < limit:
                out.append(consumer.receive(timeout_millis=wait_ms).data())
        consumer.close()
    finally:
        client.close()
    return out
