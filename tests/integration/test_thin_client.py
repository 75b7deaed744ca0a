"""The client is its own, thin distribution (ADR 0019).

``client/`` is built into a wheel and installed into a fresh virtual environment (both
under the test's tmp_path): there ``thalweg_client`` imports with the typing marker and
the ticket descriptor it loads, none of the gateway's heavy dependencies are present,
and a script run by that environment's python reads a topic from a running gateway.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.conftest import RunningGateway

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLIENT = Path(__file__).resolve().parents[2] / "client"
ABSENT = ["thalweg", "aiokafka", "datafusion", "opentelemetry.sdk", "pydantic", "click"]

SCRIPT = """
import importlib, json, sys
from importlib import resources

import thalweg_client

present = []
for name in sys.argv[3].split(","):
    try:
        importlib.import_module(name)
    except ImportError:
        continue
    present.append(name)
package = resources.files("thalweg_client")
table = thalweg_client.connect(sys.argv[1]).read(sys.argv[2])
print(json.dumps({
    "file": thalweg_client.__file__,
    "present": present,
    "py_typed": package.joinpath("py.typed").is_file(),
    "descriptor": package.joinpath("wire", "ticket_v1.desc").is_file(),
    "rows": table.num_rows,
    "ids": sorted(table.column("id").to_pylist()),
}))
"""


def run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        args, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=420
    )
    assert done.returncode == 0, f"{args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture
def thin_python(tmp_path: Path) -> Path:
    """The python of a fresh venv holding only the client wheel and its dependencies."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    source = tmp_path / "client-src"  # builds leave nothing in the checkout
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = tmp_path / "thin-venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    dist = tmp_path / "dist"
    run(
        [str(python), "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(source)],
        tmp_path,
        env,
    )
    (wheel,) = dist.glob("thalweg_client-0.1.0-*.whl")
    run([str(python), "-m", "pip", "install", str(wheel)], tmp_path, env)
    return python


@pytest.mark.timeout(900)
def test_the_client_alone_reads_a_topic(
    tmp_path: Path,
    thin_python: Path,
    topic_factory: Callable[..., str],
    producer: Producer,
    gateway_factory: Callable[..., RunningGateway],
) -> None:
    topic = topic_factory(2)
    for i in range(50):
        producer.produce(topic, json.dumps({"id": i, "name": f"n{i}"}).encode(), partition=i % 2)
    producer.flush(10)
    gw = gateway_factory([topic])
    gw.wait_durable(topic, {0: 25, 1: 25})

    script = tmp_path / "read_topic.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = run(
        [str(thin_python), str(script), gw.flight_url, topic, ",".join(ABSENT)], tmp_path, env
    )
    seen = json.loads(out.strip().splitlines()[-1])

    assert Path(seen["file"]).is_relative_to(tmp_path / "thin-venv")
    assert seen["present"] == []
    assert seen["py_typed"]
    assert seen["descriptor"]
    assert seen["rows"] == 50
    assert seen["ids"] == list(range(50))
