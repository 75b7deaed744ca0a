"""The ``twg`` command line: config checks with click's runner, quickstart as a process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

import thalweg_client
from tests.helpers import wait_until
from thalweg.cli.main import cli

GOOD = """
[gateway]
data_dir = "./lane"

[[sources]]
name = "main"
kind = "kafka"
bootstrap_servers = "127.0.0.1:9092"
topics = ["orders"]
sasl_mechanism = "PLAIN"
sasl_username = "svc"
sasl_password = "hunter2"
security_protocol = "SASL_PLAINTEXT"
"""


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), obj={})
    return result.exit_code, result.stdout, result.stderr


def test_validate_accepts_a_good_file(tmp_path: Path) -> None:
    f = tmp_path / "good.toml"
    f.write_text(GOOD)
    code, out, _ = run("config", "validate", str(f))
    assert code == 0
    assert "ok:" in out and "orders" in out


def test_validate_checks_the_contract_and_lists_what_it_does_not_enforce(tmp_path: Path) -> None:
    contract = tmp_path / "orders.odcs.yaml"
    contract.write_text(
        "apiVersion: v3.0.2\nkind: DataContract\nschema:\n"
        "  - name: orders\n    properties:\n      - {name: id, required: true}\n"
        "    quality:\n      - {type: sql, query: 'SELECT COUNT(*) FROM orders'}\n"
    )
    f = tmp_path / "c.toml"
    f.write_text(GOOD + f'contract = "{contract}"\n')
    code, out, _ = run("config", "validate", str(f))
    assert code == 0, out
    assert "note: not enforced per record:" in out and "(sql)" in out
    contract.write_text(
        "apiVersion: v3.0.2\nkind: DataContract\nschema:\n  - name: orders\n"
        "    properties:\n      - {name: id, logicalType: money}\n"
    )
    code, _, err = run("config", "validate", str(f))
    assert code == 2
    assert "sources.main.contract" in err and "logicalType 'money'" in err


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (
            "[[sources]]\nname='a'\nkind='kafka'\ntopics=['x']\n",
            "sources.0.bootstrap_servers: Field required",
        ),
        (
            "[[sources]]\nname='a'\nkind='kafka'\nbootstrap_servers='h:1'\ntopics=[]\n",
            "either topics or a topics_pattern",
        ),
        (
            "[gateway]\nflight_listen='localhost'\n[[sources]]\nname='a'\nkind='kafka'\nbootstrap_servers='h:1'\ntopics=['x']\n",
            "gateway.flight_listen",
        ),
        (
            "[gateway]\ndata_dri='x'\n[[sources]]\nname='a'\nkind='kafka'\nbootstrap_servers='h:1'\ntopics=['x']\n",
            "gateway.data_dri: Extra inputs are not permitted",
        ),
        (
            "[[sources]]\nname='a'\nkind='pulsar'\nbootstrap_servers='h:1'\ntopics=['x']\n",
            "sources.0",
        ),
        (
            "[[sources]]\nname='p'\nkind='pulsar'\nservice_url='pulsar://h:6650'\ntopics=['x']\ntopics_pattern='x.*'\n",
            "either topics or a topics_pattern",
        ),
        (
            "[[sources]]\nname='p'\nkind='pulsar'\nservice_url='http://h:8080'\ntopics=['x']\n",
            "service_url must start with pulsar://",
        ),
        (
            "[[sources]]\nname='p'\nkind='pulsar'\nservice_url='pulsar://h:6650'\ntopics=['x']\nsubscription_type='fanout'\n",
            "sources.0.pulsar.subscription_type",
        ),
        (
            "[raw_lane]\nroll_rows=0\n[[sources]]\nname='a'\nkind='kafka'\nbootstrap_servers='h:1'\ntopics=['x']\n",
            "raw_lane.roll_rows",
        ),
        (  # refused at start, so refused here too (engine/preflight.py)
            "[[sources]]\nname='a'\nkind='kafka'\nbootstrap_servers='h:1'\ntopics=['x']\n"
            "[[pipeline.nodes]]\nname='n'\nfrom='x'\nquery='select * from input'\n",
            "pipeline.nodes.n: nothing is fed from this node",
        ),
        ("this is = not toml [", "not valid TOML"),
    ],
)
def test_validate_names_the_bad_key(tmp_path: Path, body: str, needle: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(body)
    code, _out, err = run("config", "validate", str(f))
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1, "one clear line"


def test_validate_json_output_and_missing_file(tmp_path: Path) -> None:
    code, _, err = run("--output", "json", "config", "validate", str(tmp_path / "nope.toml"))
    assert code == 2
    assert json.loads(err)["ok"] is False


def test_show_hides_secrets_and_secrets_lists_keys(tmp_path: Path) -> None:
    f = tmp_path / "good.toml"
    f.write_text(GOOD)
    code, out, _ = run("config", "show", str(f))
    assert code == 0 and "hunter2" not in out and "**********" in out
    assert '"roll_age_s": 5.0' in out  # defaults are filled in
    code, out, _ = run("config", "secrets", str(f))
    assert code == 0 and out.strip() == "sources.0.sasl_password"


def test_help_is_useful() -> None:
    for args in ([], ["stream"], ["config"], ["config", "validate"], ["quickstart"]):
        code, out, _ = run(*args, "--help")
        assert code == 0 and "Usage:" in out
    _, out, _ = run("quickstart", "--help")
    assert "--rate" in out and "orders" in out


@pytest.mark.integration
@pytest.mark.slow
def test_quickstart_serves_a_read_and_stops_cleanly(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "thalweg.cli.main",
            "quickstart",
            "--flight-port",
            "0",
            "--http-port",
            "0",
            "--rate",
            "50",
            "--data-dir",
            str(tmp_path / "qs"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline().decode()
            match = re.match(r"^flight\s+(grpc://\S+)", line)
            if match:
                url = match.group(1)
        assert url, "quickstart did not print its Flight URL"

        def orders() -> pa.Table | None:
            with thalweg_client.connect(url) as client:
                if "orders" not in client.topics():
                    return None
                got = client.read("orders")
                return got if got.num_rows else None

        table = wait_until(
            orders, max(1.0, deadline - time.monotonic()), "orders served", interval=1.0
        )
        assert {"order_id", "customer", "amount", "_twg_source_offset"} <= set(table.column_names)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_example_configs_validate() -> None:
    root = Path(__file__).resolve().parents[2]
    for f in sorted((root / "deploy" / "config").glob("*.toml")):
        code, out, err = run("config", "validate", str(f))
        assert code == 0, err
        assert "orders" in out
