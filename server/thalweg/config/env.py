"""``${NAME}`` in a configuration file's strings: values that differ per pod or are
kept out of the file (Kubernetes sets them from the pod's name or from a Secret).

Every string value of the TOML — at any depth, in tables and arrays — may hold
``${NAME}``: it is replaced by the environment variable ``NAME`` when the file is loaded.
A variable that is not set is an error naming the key and the variable (never an empty
string quietly put in its place). ``$${`` stands for a literal ``${``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from thalweg.errors import ConfigError

_REF = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env(data: Any, environ: Mapping[str, str] | None = None, *, where: str = "") -> Any:
    """``data`` with each ``${NAME}`` in its strings replaced from ``environ``.

    Raises:
        ConfigError: a referenced variable is not set.
    """
    env = os.environ if environ is None else environ
    if isinstance(data, str):
        return _expand(data, env, where)
    if isinstance(data, dict):
        return {
            k: expand_env(v, env, where=f"{where}.{k}" if where else k) for k, v in data.items()
        }
    if isinstance(data, list):
        return [expand_env(v, env, where=f"{where}[{i}]") for i, v in enumerate(data)]
    return data


def _expand(text: str, env: Mapping[str, str], where: str) -> str:
    def value(m: re.Match[str]) -> str:
        if m[0] == "$${":
            return "${"
        name = m[1]
        if name not in env:
            raise ConfigError(f"{where}: environment variable {name} is not set (in {text!r})")
        return env[name]

    return _REF.sub(value, text)
