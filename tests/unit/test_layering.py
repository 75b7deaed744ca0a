"""The layering gate: ``records`` and ``codecs`` are pure data code.

They turn bytes into Arrow and never import a broker client, a socket, the event loop,
or any part of the gateway above them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "server" / "thalweg"
FORBIDDEN_EXTERNAL = {
    "aiokafka",
    "confluent_kafka",
    "pulsar",
    "asyncio",
    "socket",
    "grpc",
    "http",
    "selectors",
    "ssl",
    "subprocess",
}
ALLOWED_INTERNAL = {
    "records": {"thalweg.records", "thalweg.errors"},
    "codecs": {"thalweg.records", "thalweg.codecs", "thalweg.errors"},
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED_INTERNAL))
def test_pure_layers_import_nothing_above_them(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    for f in files:
        for name in imports_of(f):
            top = name.split(".")[0]
            assert top not in FORBIDDEN_EXTERNAL, f"{f.name} imports {name}"
            if top == "thalweg":
                allowed = ALLOWED_INTERNAL[package]
                assert any(name == a or name.startswith(a + ".") for a in allowed), (
                    f"{f.relative_to(ROOT)} imports {name}"
                )


def test_client_depends_on_pyarrow_only() -> None:
    client = Path(__file__).resolve().parents[2] / "client" / "thalweg_client"
    for f in client.rglob("*.py"):
        for name in imports_of(f):
            top = name.split(".")[0]
            assert top not in {"thalweg", "aiokafka", "pydantic", "click"}, f"{f.name}: {name}"
