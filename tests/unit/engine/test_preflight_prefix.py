"""A gateway with its own ``metadata_prefix`` refuses, at validate and at start, the sinks
that still name metadata columns by the default ``_twg_`` (engine/preflight.py), and
keeps those that do not."""

from __future__ import annotations

from typing import Any

import pytest

from thalweg.config import parse_config
from thalweg.engine.preflight import preflight


def config(sink: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {
        "gateway": {"metadata_prefix": prefix},
        "sources": [
            {"name": "k", "kind": "kafka", "bootstrap_servers": "127.0.0.1:9", "topics": ["t"]}
        ],
        "sinks": [{"name": "s", "topics": ["t"], **sink}],
    }


REFUSED = [
    ({"kind": "postgres", "dsn": "postgresql://u@127.0.0.1:9/db"}, "a postgres sink"),
    ({"kind": "iceberg", "mode": "upsert", "key": ["id"]}, "mode = 'upsert'"),
    ({"kind": "arrow_ipc", "path": "out/{tenant}"}, "a table or path that names a column"),
    ({"kind": "iceberg", "table": "{tenant}_orders"}, "a table or path that names a column"),
]


@pytest.mark.parametrize(("sink", "why"), REFUSED)
def test_sinks_naming_default_columns_are_refused_under_another_prefix(
    sink: dict[str, Any], why: str
) -> None:
    problems = preflight(parse_config(config(sink, "meta_"))).problems
    assert len(problems) == 1
    assert problems[0].startswith(f"sinks.s: {why} is not supported yet")
    assert "metadata_prefix = 'meta_'" in problems[0]
    # The same sink under the default prefix has nothing against it.
    assert preflight(parse_config(config(sink, "_twg_"))).problems == []


@pytest.mark.parametrize("sink", [{"kind": "arrow_ipc"}, {"kind": "iceberg"}])
def test_sinks_that_name_no_metadata_column_are_not_refused(sink: dict[str, Any]) -> None:
    assert preflight(parse_config(config(sink, "meta_"))).problems == []
