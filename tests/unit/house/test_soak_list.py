"""``make soak`` runs every end-to-end fault test: a new one joins it by being listed."""

from __future__ import annotations

from pathlib import Path

from tests.soak import FAULT_TESTS

E2E = Path(__file__).resolve().parents[2] / "e2e"


def test_every_fault_test_is_soaked() -> None:
    files = sorted(p.name for p in E2E.glob("test_*.py"))
    assert sorted(FAULT_TESTS) == files
