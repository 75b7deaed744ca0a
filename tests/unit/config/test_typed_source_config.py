"""Configuration of the sources whose rows arrive typed: files, Arrow IPC drops, Flight."""

from __future__ import annotations

from typing import Any

import pytest

from thalweg.config.load import parse_config
from thalweg.errors import ConfigError


def config(**source: Any) -> dict[str, Any]:
    return {"sources": [{"name": "s", "topics": ["t"], **source}]}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"kind": "files", "format": "json"}, "not format"),
        ({"kind": "files", "topics": ["a", "b"]}, "at most 1"),
        ({"kind": "arrow_ipc"}, "directory"),
        ({"kind": "flight", "location": "http://x:1"}, "grpc://"),
        ({"kind": "flight"}, "location"),
        ({"kind": "files", "registry": {"url": "http://r"}}, "no registry"),
        ({"kind": "files", "csv_delimiter": "'", "csv_quote": "'"}, "must differ"),
        ({"kind": "files", "csv_quote": "\n"}, "line break"),
        ({"kind": "files", "csv_quote": "ab"}, "at most 1"),
        ({"kind": "files", "csv_quote": "\t"}, "tab"),
        ({"kind": "files", "csv_quote": "é"}, "ASCII"),
        ({"kind": "files", "envelope": "debezium"}, "no envelope"),
        (
            {"kind": "kafka", "bootstrap_servers": "b:1", "envelope": "debezium", "format": "none"},
            "JSON or Avro",
        ),
        ({"kind": "kafka", "envelope": "cloudevents"}, "envelope"),
    ],
)
def test_typed_sources_refuse_what_does_not_apply(source: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(config(**source))


def test_typed_sources_parse_with_their_defaults_and_list_their_secrets() -> None:
    cfg = parse_config(
        {
            "sources": [
                {"kind": "files", "name": "f", "topics": ["a"]},
                {"kind": "arrow_ipc", "name": "i", "topics": ["b"], "directory": "/drops"},
                {
                    "kind": "flight",
                    "name": "up",
                    "topics": ["c"],
                    "location": "grpc://127.0.0.1:8815",
                    "token": "s3cret",
                },
            ]
        }
    )
    files, ipc, flight = cfg.sources
    assert files.kind == "files" and files.max_poll_records == 256 * 1024
    assert ipc.kind == "arrow_ipc" and ipc.pattern == "*.arrow*"
    assert flight.kind == "flight" and flight.upstream_topic is None
    assert cfg.secrets() == ["sources.2.token"]


def test_every_secret_is_listed_wherever_it_sits() -> None:
    """Secrets are found by walking the models, not from a hand-kept list: a sidecar
    node's token (missed by the hand-kept list) is named too."""
    cfg = parse_config(
        {
            "sources": [{"kind": "files", "name": "f", "topics": ["a"]}],
            "pipeline": {
                "nodes": [
                    {
                        "name": "n",
                        "from": "a",
                        "sidecar": "grpc://127.0.0.1:1",
                        "command": "enrich",
                        "token": "sidecar-token",
                    }
                ]
            },
            "gateway": {"auth": {"tokens": [{"token": "reader-token-0123456789", "name": "r"}]}},
        }
    )
    assert cfg.secrets() == ["gateway.auth.tokens.0.token", "pipeline.nodes.0.token"]
    shown = cfg.model_dump_json()
    assert "sidecar-token" not in shown and "reader-token" not in shown
