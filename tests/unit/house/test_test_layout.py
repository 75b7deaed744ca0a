"""The unit tests mirror the packages: a room's tests are found by its name
(``tests/unit/<package>/``), the client's in ``client/``, and the gates that read the
whole house in ``house/``. A test file dropped at the top, or into a folder named after
no package, fails here."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parents[1]
SERVER = UNIT.parents[1] / "server" / "thalweg"
EXTRA = {"client", "house"}


def test_unit_tests_live_in_a_folder_named_after_their_package() -> None:
    packages = {d.name for d in SERVER.iterdir() if (d / "__init__.py").exists()}
    assert sorted(p.name for p in UNIT.glob("test_*.py")) == []
    folders = {d.name for d in UNIT.iterdir() if d.is_dir() and any(d.glob("test_*.py"))}
    assert folders - packages - EXTRA == set()
