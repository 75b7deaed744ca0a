"""``twg stream`` on a host that cannot run its configuration: one line naming the
setting and the cause, exit 2, no traceback (and nothing from gRPC on stderr); ``twg
config validate`` finds what it can without creating, binding or connecting anything."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from thalweg.cli.main import cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIG = """
[gateway]
data_dir = "{data_dir}"
flight_listen = "grpc://127.0.0.1:{flight}"
http_listen = "127.0.0.1:{http}"

[[sources]]
name = "main"
kind = "kafka"
bootstrap_servers = "127.0.0.1:1"
topics = ["orders"]
"""


def write_config(tmp_path: Path, data_dir: Path | str, flight: int = 0, http: int = 0) -> Path:
    path = tmp_path / f"twg-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(CONFIG.format(data_dir=data_dir, flight=flight, http=http))
    return path


def stream(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "thalweg.cli.main", "stream", "--config", str(config)],
        capture_output=True,
        check=False,
        text=True,
        cwd=cwd,
        timeout=60,
    )


def validate(config: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["config", "validate", str(config)], obj={})
    return result.exit_code, result.stderr


def assert_one_line(stderr: str, setting: str, cause: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"error: {setting}"), stderr
    assert cause in lines[0], stderr
    assert "Traceback" not in stderr


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port another process (here: this one) listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def unwritable_dir(tmp_path: Path) -> Path:
    """A directory the gateway cannot write into: read-only by mode, or — as root, who
    writes anywhere — a path under sysfs, where nothing can be created."""
    if os.geteuid() != 0:
        d = tmp_path / "read-only"
        d.mkdir()
        d.chmod(0o555)
        return d
    return Path("/sys") / f"twg-{uuid.uuid4().hex[:8]}"


def test_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "lanes"
    f.write_text("not a directory")
    config = write_config(tmp_path, f)
    code, err = validate(config)
    assert code == 2
    assert_one_line(err, "gateway.data_dir", "is not a directory")
    run = stream(config, tmp_path)
    assert run.returncode == 2
    assert_one_line(run.stderr, "gateway.data_dir", "is not a directory")
    config = write_config(tmp_path, f / "below")
    code, err = validate(config)
    assert code == 2
    assert_one_line(err, "gateway.data_dir", "is not a directory")


def test_an_unwritable_data_dir(tmp_path: Path) -> None:
    config = write_config(tmp_path, unwritable_dir(tmp_path))
    run = stream(config, tmp_path)
    assert run.returncode == 2, run.stderr
    cause = "cannot write to" if os.geteuid() == 0 else "is not writable"
    assert_one_line(run.stderr, "gateway.data_dir", cause)
    if os.geteuid() != 0:  # an existing directory's mode is visible without writing
        code, err = validate(config)
        assert code == 2
        assert_one_line(err, "gateway.data_dir", "not writable (permission denied)")


def test_a_flight_port_in_use(tmp_path: Path, held_port: int) -> None:
    config = write_config(tmp_path, tmp_path / "lanes", flight=held_port)
    assert validate(config)[0] == 0  # not a property of the file: only known at start
    run = stream(config, tmp_path)
    assert run.returncode == 2
    assert_one_line(run.stderr, "gateway.flight_listen", f"127.0.0.1:{held_port} is already in use")


def test_an_http_port_in_use(tmp_path: Path, held_port: int) -> None:
    config = write_config(tmp_path, tmp_path / "lanes", http=held_port)
    run = stream(config, tmp_path)
    assert run.returncode == 2
    assert_one_line(run.stderr, "gateway.http_listen", f"127.0.0.1:{held_port} is already in use")


@pytest.mark.parametrize(
    ("flight", "http", "setting"), [(99999, 0, "flight_listen"), (0, 70000, "http_listen")]
)
def test_a_port_out_of_range(tmp_path: Path, flight: int, http: int, setting: str) -> None:
    config = write_config(tmp_path, tmp_path / "lanes", flight=flight, http=http)
    code, err = validate(config)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"gateway.{setting}" in lines[0] and "0-65535" in lines[0], err
    run = stream(config, tmp_path)
    assert run.returncode == 2
    assert f"gateway.{setting}" in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "lanes").exists()  # refused before anything was created


def test_quickstart_names_its_option(tmp_path: Path, held_port: int) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "thalweg.cli.main",
            "quickstart",
            "--flight-port",
            str(held_port),
            "--http-port",
            "0",
            "--data-dir",
            str(tmp_path / "qs"),
        ],
        capture_output=True,
        check=False,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert_one_line(run.stderr, "--flight-port", f"127.0.0.1:{held_port} is already in use")
