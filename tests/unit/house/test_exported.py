"""Public API: every name in ``__all__`` exists."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "thalweg",
    "thalweg.records",
    "thalweg.codecs",
    "thalweg.contracts",
    "thalweg.config",
    "thalweg.lane",
    "thalweg.flight",
    "thalweg.engine",
    "thalweg.embedded",
    "thalweg.sources",
    "thalweg_client",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name: str) -> None:
    module = importlib.import_module(name)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr}"
