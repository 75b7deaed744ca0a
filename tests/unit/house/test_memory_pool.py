"""``twg`` gives Arrow jemalloc unless ARROW_DEFAULT_MEMORY_POOL says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa

PROBE = "import thalweg.cli.main, pyarrow as pa; print(pa.default_memory_pool().backend_name)"


def _backend(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        check=False,
        env={**clean, **env},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_cli_picks_jemalloc() -> None:
    # A pyarrow build without jemalloc keeps its own default; this machine's has it.
    want = "jemalloc" if "jemalloc" in pa.supported_memory_backends() else None
    assert _backend() == (want or pa.default_memory_pool().backend_name)


def test_the_environment_wins() -> None:
    assert _backend(ARROW_DEFAULT_MEMORY_POOL="system") == "system"
