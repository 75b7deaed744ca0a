"""The worked examples in docs/sinks.md and docs/cdc.md ("Worked examples") are
configurations the gateway accepts: each TOML block there, with a source where it has
none, parses (contract paths aside: a file named there need not exist here)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from thalweg.config import parse_config

DOCS = Path(__file__).resolve().parents[3] / "docs"
SOURCE = {"name": "k", "kind": "kafka", "bootstrap_servers": "127.0.0.1:9", "topics": []}


def _blocks(doc: str) -> list[str]:
    text = (DOCS / doc).read_text("utf-8")
    start = text.index("## Worked examples")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```toml\n(.*?)```", text[start:end], flags=re.S)


BLOCKS = [(doc, i, b) for doc in ("sinks.md", "cdc.md") for i, b in enumerate(_blocks(doc))]


def test_the_examples_are_there() -> None:
    assert len([b for b in BLOCKS if b[0] == "sinks.md"]) >= 3
    assert len([b for b in BLOCKS if b[0] == "cdc.md"]) >= 3


@pytest.mark.parametrize(("doc", "index", "block"), BLOCKS, ids=lambda v: str(v)[:20])
def test_a_worked_example_is_a_configuration_the_gateway_takes(
    doc: str, index: int, block: str, tmp_path: Path
) -> None:
    body: dict[str, Any] = tomllib.loads(block)
    for src in body.get("sources", []):
        src.pop("contract", None)  # a path on the reader's machine
    sinks = body.get("sinks", [])
    topics = sorted({t for s in sinks for t in s.get("topics", [])})
    body.setdefault("sources", [{**SOURCE, "topics": topics or ["orders"]}])
    body.setdefault("gateway", {"data_dir": str(tmp_path)})
    cfg = parse_config(body)
    assert [s.name for s in cfg.sinks] == [s["name"] for s in sinks]
