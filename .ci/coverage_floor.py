"""The coverage floor only rises: fail when pyproject's ``fail_under`` is lower than the
previous commit's. Without git history (an exported tree, a shallow clone of one commit)
there is nothing to compare, and it says so."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def floor(text: str) -> float:
    return float(tomllib.loads(text)["tool"]["coverage"]["report"]["fail_under"])


def main() -> int:
    now = floor((ROOT / "pyproject.toml").read_text("utf-8"))
    before = subprocess.run(
        ["git", "-C", str(ROOT), "show", "HEAD~1:pyproject.toml"],
        capture_output=True,
        text=True,
        check=False,
    )
    if before.returncode != 0:
        print(f"coverage floor {now}: no previous commit to compare with")
        return 0
    try:
        was = floor(before.stdout)
    except KeyError:  # the commit before the floor existed
        print(f"coverage floor {now}: new")
        return 0
    if now < was:
        print(f"coverage floor lowered from {was} to {now}: it only rises", file=sys.stderr)
        return 1
    print(f"coverage floor {now} (was {was})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
