"""``twg recover``'s destination check when it cannot run: the pass's summary stands,
the reason is said, and the command does not claim "ok" (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from thalweg.cli.main import cli


def test_a_check_that_cannot_run_keeps_the_summary_and_fails(tmp_path: Path) -> None:
    # A topic the source's pattern matches and the lane has not seen: the pass has
    # nothing to do, and verify refuses a topic it can find nowhere.
    config = tmp_path / "twg.toml"
    config.write_text(
        f"""
[gateway]
data_dir = "{tmp_path / "lane"}"

[[sources]]
name = "k"
kind = "kafka"
bootstrap_servers = "127.0.0.1:9"
topics_pattern = "t|u"

[[sinks]]
name = "files"
kind = "arrow_ipc"
topics = ["u"]
"""
    )
    args = ["recover", "-c", str(config), "--sink", "files", "--topic", "u"]
    text = CliRunner().invoke(cli, args, obj={})
    assert text.exit_code == 1, text.output
    assert "sink files: 0 rows" in text.output
    assert "the destination check could not run: no topic 'u'" in text.output
    js = CliRunner().invoke(cli, ["--output", "json", *args], obj={})
    assert js.exit_code == 1
    data = json.loads(js.output)
    assert data["ok"] is False and data["rows"] == 0 and "no topic 'u'" in data["check_error"]
    # Without the check the pass alone answers.
    done = CliRunner().invoke(cli, [*args, "--no-check"], obj={})
    assert done.exit_code == 0, done.output
