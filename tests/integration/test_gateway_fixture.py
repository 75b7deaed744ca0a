"""The test gateway fixture itself: a gateway that dies after a test's last wait fails
that test at teardown instead of passing unnoticed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

DYING = """
from confluent_kafka import Producer

from tests.conftest import *  # noqa: F403  (the fixtures under test)
from tests.helpers import wait_until


def test_gateway_dies_after_the_last_wait(gateway_factory, topic_factory, broker):
    topic = topic_factory(1)
    gw = gateway_factory([topic])
    p = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 2})
    p.produce(topic, b'{"a": 1}', partition=0)
    p.flush(10)
    gw.wait_durable(topic, {0: 1})  # the test's last wait: all is well so far

    def broken_disk(*args, **kwargs):
        raise RuntimeError("disk on fire")

    gw.gateway.runners[0].ctx.writer.write = broken_disk
    p.produce(topic, b'{"a": 2}', partition=0)
    p.flush(10)
    # The flush fails and the gateway stops; the test body still "passes".
    wait_until(lambda: gw.errors, 30, "the gateway to die")
"""


def test_teardown_fails_on_a_gateway_error_nobody_took(tmp_path: Path) -> None:
    (tmp_path / "test_dying.py").write_text(textwrap.dedent(DYING))
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    proc = subprocess.run(
        # Its own basetemp: a pytest session without one resets /tmp/pytest-of-<user> to
        # 0700, and the outer session's PostgreSQL (another user) loses its data
        # directory mid-run (fresh-clone CI, session 22).
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'inner'}",
            "test_dying.py",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *pythonpath])},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "1 passed, 1 error" in out, out[-3000:]
    assert "gateway 0 raised RuntimeError('disk on fire')" in out, out[-3000:]
