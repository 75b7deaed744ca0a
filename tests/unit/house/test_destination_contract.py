"""One place per destination: nothing outside ``thalweg.sinks`` switches on a sink's
kind or reaches into a destination's module. ``twg verify``, ``twg recover`` and the
feeder ask the destination through the contract (``Sink.holds``, ``Sink.rebuild_step``,
``Sink.capabilities``; ``sinks/base.py``), so a new destination is one module and one
line in ``sinks/loader.py`` — never a fourth copy of its layout in verify."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from thalweg.sinks.base import Sink
from thalweg.sinks.contract import Capabilities
from thalweg.sinks.loader import SINKS, load_sink_class

ROOT = Path(__file__).resolve().parents[3] / "server" / "thalweg"
#: Where a kind is named on purpose: the destinations themselves, and the configuration
#: models that parse ``kind = "..."``.
OWNERS = ("sinks", "config")


def _outside() -> list[Path]:
    return [f for f in sorted(ROOT.rglob("*.py")) if f.relative_to(ROOT).parts[0] not in OWNERS]


def _kind_tests(tree: ast.AST) -> list[int]:
    """Lines comparing something's ``.kind`` with a sink kind's name."""
    kinds = set(SINKS)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides):
            continue
        named = {
            c.value
            for s in sides
            for c in ast.walk(s)
            if isinstance(c, ast.Constant) and isinstance(c.value, str)
        }
        if named & kinds:
            found.append(node.lineno)
    return found


def test_nothing_outside_the_destinations_switches_on_a_sink_kind() -> None:
    found = [
        f"{f.relative_to(ROOT)}:{line}"
        for f in _outside()
        for line in _kind_tests(ast.parse(f.read_text("utf-8")))
    ]
    assert not found, (
        "ask the destination (Sink.holds / rebuild_step / capabilities):\n" + "\n".join(found)
    )


def test_nothing_outside_the_destinations_imports_one_of_their_modules() -> None:
    shared = {
        "thalweg.sinks",
        "thalweg.sinks.base",
        "thalweg.sinks.contract",
        "thalweg.sinks.loader",
        "thalweg.sinks.fold",
        "thalweg.sinks.routes",
        "thalweg.sinks.node_lane",
        "thalweg.sinks.table_docs",  # what every table says, built from the contracts
    }
    found = []
    for f in _outside():
        for node in ast.walk(ast.parse(f.read_text("utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [
                f"{f.relative_to(ROOT)}:{node.lineno} imports {n}"
                for n in names
                if n.startswith("thalweg.sinks.") and n not in shared
            ]
    assert not found, "\n".join(found)


def test_the_gate_sees_a_kind_switch() -> None:
    assert _kind_tests(ast.parse('if cfg.kind == "postgres":\n    pass')) == [1]
    assert _kind_tests(ast.parse('x = s.kind in ("iceberg", "other")')) == [1]
    assert _kind_tests(ast.parse('if node.kind == "sql":\n    pass')) == []


@pytest.mark.parametrize("kind", sorted(SINKS))
def test_every_destination_declares_what_it_supports(kind: str) -> None:
    cls = load_sink_class(kind)
    assert isinstance(cls.capabilities, Capabilities)
    assert cls.kind == kind
    # Reading back is what verify checks rows with: a destination that keeps a record
    # of its own says how to read it.
    if cls.capabilities.reads_back:
        assert cls.holds is not Sink.holds, f"{kind} reads back through Sink.holds' default"
    else:
        assert cls.holds is Sink.holds
