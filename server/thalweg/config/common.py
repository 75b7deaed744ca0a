"""What every configuration model shares: frozen, unknown keys refused, secrets read
from files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr

MiB = 1 << 20


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _read_secret(path: Path, what: str) -> SecretStr:
    try:
        return SecretStr(path.read_text(encoding="utf-8").strip())
    except OSError as exc:
        raise ValueError(f"cannot read {what} file {str(path)!r}: {exc.strerror}") from exc


def secret_paths(value: Any, path: str = "") -> list[str]:
    """Dotted paths of every secret set in a configuration tree, in document order.

    Found by walking the models for ``SecretStr`` values, not from a list kept by hand:
    a new secret key (a sidecar's token, a new sink's password) is listed the day it
    is added, by ``twg config secrets`` and wherever secrets are kept out of output.
    """
    if isinstance(value, SecretStr):
        return [path]
    items: list[tuple[str, Any]]
    if isinstance(value, BaseModel):
        items = [(name, getattr(value, name)) for name in type(value).model_fields]
    elif isinstance(value, list | tuple):
        items = [(str(i), v) for i, v in enumerate(value)]
    elif isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    else:
        return []
    out: list[str] = []
    for name, child in items:
        out += secret_paths(child, f"{path}.{name}" if path else name)
    return out
