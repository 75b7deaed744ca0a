"""``${NAME}`` in configuration strings comes from the environment, at any depth; an
unset variable names the key; ``$${`` is a literal; other values are left alone."""

from __future__ import annotations

import pytest

from thalweg.config.env import expand_env
from thalweg.errors import ConfigError


def test_references_are_expanded_at_any_depth_and_escapes_kept() -> None:
    env = {"POD": "thalweg-1", "PW": "x$y"}
    data = {
        "gateway": {"flight_advertise": "grpc://${POD}.thalweg:8815", "port": 8815},
        "sources": [{"sasl_password": "${PW}", "topics": ["a-${POD}", "$${POD}"]}],
    }
    out = expand_env(data, env)
    assert out["gateway"] == {"flight_advertise": "grpc://thalweg-1.thalweg:8815", "port": 8815}
    assert out["sources"][0] == {"sasl_password": "x$y", "topics": ["a-thalweg-1", "${POD}"]}
    assert expand_env("no $ refs $HOME {x}", {}) == "no $ refs $HOME {x}"


def test_an_unset_variable_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"sources\[0\]\.topics\[1\]: environment variable "):
        expand_env({"sources": [{"topics": ["a", "${NOPE}"]}]}, {})
