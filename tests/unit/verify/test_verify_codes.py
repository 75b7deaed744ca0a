"""Every finding ``twg verify`` can report is documented and planted by a test.

The codes are read from the verifier's own ``report.add`` calls, so a new detector
fails here until ``docs/operations.md``'s table has its row — naming the test that
plants its fault — and that test names the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
VERIFY = ROOT / "server" / "thalweg" / "verify"
DOCS = ROOT / "docs" / "operations.md"


def emitted() -> set[str]:
    """The code argument of every ``report.add(level, code, ...)`` in the verifier."""
    codes: set[str] = set()
    for f in VERIFY.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text("utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add"
                and len(node.args) >= 2
            ):
                codes |= {
                    c.value
                    for c in ast.walk(node.args[1])
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
    return codes


def documented() -> dict[str, str]:
    """Code → the last cell of its row (the test that plants it) in the docs' table."""
    rows = {}
    lines = DOCS.read_text("utf-8").splitlines()
    start = lines.index("| code | level | what it means | planted in |")
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break  # the table ends
        cells = [c.strip() for c in line.strip("|").split("|")]
        for code in re.findall(r"`([a-z_]+)`", cells[0]):
            rows[code] = cells[-1]
    return rows


def test_every_code_the_verifier_reports_has_a_row_and_every_row_a_code() -> None:
    codes, rows = emitted(), documented()
    assert codes, "no report.add calls found: the reader broke"
    assert sorted(codes - set(rows)) == [], "undocumented verify codes"
    assert sorted(set(rows) - codes) == [], "documented codes verify never reports"


def test_each_row_names_a_test_that_plants_its_fault() -> None:
    for code, cell in sorted(documented().items()):
        named = re.findall(r"`(tests/[\w/]+\.py)`", cell)
        assert named, f"{code}: its row names no test"
        planting = [p for p in named if f'"{code}"' in (ROOT / p).read_text("utf-8")]
        assert planting, f"{code}: none of {named} names it"
