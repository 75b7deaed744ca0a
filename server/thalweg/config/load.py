"""Read a TOML file into :class:`ThalwegConfig`, with errors that name the key;
``${NAME}`` in its strings comes from the environment (``config.env``)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from thalweg.config.env import expand_env
from thalweg.config.models import ThalwegConfig
from thalweg.errors import ConfigError


def parse_config(data: dict[str, Any], *, origin: str = "<config>") -> ThalwegConfig:
    """Validate an already-parsed mapping."""
    try:
        return ThalwegConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: {_first_error(exc)}") from exc


def load_config(path: str | Path) -> ThalwegConfig:
    """Load and validate ``path``; raises :class:`ConfigError` with one clear line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config file: {exc.strerror}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from exc
    try:
        data = expand_env(data)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from exc
    return parse_config(data, origin=str(p))


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"] if not str(part).startswith("function-"))
    # Discriminated unions put the tag in the location ("sources.0.kafka.topics").
    loc = loc.replace(".kafka.", ".")
    msg = first["msg"].removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {msg}{more}" if loc else f"{msg}{more}"
