"""``twg recover``'s destination check on a lane written here and Arrow IPC sinks (no
service needed): a check that cannot run — no such topic, a damaged file — keeps the
pass's summary, says why and does not claim "ok" (exit 1); a routed sink's lost file is
named with the runbook's step for it, and the step works."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from click.testing import CliRunner

from tests.helpers import ipc_sink_config, write_segment
from thalweg.cli.main import cli
from thalweg.records import MetadataColumns

COLS = MetadataColumns()


def lane_of_six(tmp_path: Path, sink_path: str | None = None) -> tuple[Path, list[str]]:
    """A lane of one segment, positions 0-5 of topic ``t`` decoded to ``{"x": ...}``
    (``a``, ``b`` alternating), and a configuration with an Arrow IPC sink ``files``
    (``path = sink_path`` when given); the lane and the recover command's args."""
    lane = tmp_path / "lane"
    write_segment(lane, "t", 0, range(6), 0, xs=["a", "b"] * 3)
    config = ipc_sink_config(tmp_path, lane, sink_path)
    return lane, ["--output", "json", "recover", "-c", str(config), "--sink", "files"]


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


def test_a_damaged_file_is_a_check_that_did_not_run_naming_the_file(tmp_path: Path) -> None:
    lane, args = lane_of_six(tmp_path)
    first = CliRunner().invoke(cli, args, obj={})
    assert first.exit_code == 0, first.output
    done = json.loads(first.output)
    assert done["check"] == [] and done["checked"].startswith("arrow_ipc, 6 records checked")
    [written] = sorted((lane / "sinks" / "files").rglob("*.arrow"))
    written.write_bytes(written.read_bytes()[: written.stat().st_size // 2])
    again = CliRunner().invoke(cli, args, obj={})
    assert again.exit_code == 1, again.output
    data = json.loads(again.output)
    assert data["ok"] is False and str(written) in data["check_error"]


def test_a_routed_sinks_lost_file_is_named_with_its_control_file_and_the_step_works(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    _lane, args = lane_of_six(tmp_path, f"{out}/{{x}}")
    first = CliRunner().invoke(cli, args, obj={})
    assert first.exit_code == 0, first.output
    data_files = sorted(f for f in out.rglob("*.arrow") if "_thalweg_coverage" not in str(f))
    assert [f.parent.parent.parent.name for f in data_files] == ["a", "b"]
    lost = data_files[0]
    lost.unlink()
    text_args = [a for a in args if a not in ("--output", "json")]
    named = CliRunner().invoke(cli, text_args, obj={})
    assert named.exit_code == 1, named.output
    assert "sink_missing" in named.output and "_thalweg_coverage" in named.output
    # The step: the control file of the same name goes too, and the next pass writes
    # the lost file back — once (the other directory holds its rows already).
    [control] = [f for f in out.rglob(lost.name) if "_thalweg_coverage" in str(f)]
    control.unlink()
    done = CliRunner().invoke(cli, args, obj={})
    assert done.exit_code == 0, done.output
    assert lost.exists()
    again = sorted(f for f in out.rglob("*.arrow") if "_thalweg_coverage" not in str(f))
    positions = [
        p for f in again for p in pa.ipc.open_file(str(f)).read_all()[COLS.position].to_pylist()
    ]
    assert sorted(positions) == list(range(6))
