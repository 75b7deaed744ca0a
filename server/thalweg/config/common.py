"""What every configuration model shares: frozen, unknown keys refused, secrets read
from files."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, SecretStr

MiB = 1 << 20


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _read_secret(path: Path, what: str) -> SecretStr:
    try:
        return SecretStr(path.read_text(encoding="utf-8").strip())
    except OSError as exc:
        raise ValueError(f"cannot read {what} file {str(path)!r}: {exc.strerror}") from exc
