"""``[[sinks]]`` and ``[recovery]``: what the configuration refuses, and its secrets."""

from __future__ import annotations

from typing import Any

import pytest

from thalweg.config import parse_config
from thalweg.config.sinks import IcebergSinkConfig, PostgresSinkConfig
from thalweg.errors import ConfigError


def cfg(sinks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "sources": [
            {
                "name": "k",
                "kind": "kafka",
                "bootstrap_servers": "127.0.0.1:9092",
                "topics": ["orders"],
            },
            {
                "name": "raw",
                "kind": "kafka",
                "bootstrap_servers": "127.0.0.1:9092",
                "topics": ["blobs"],
                "format": "none",
            },
        ],
        "sinks": sinks,
        **extra,
    }


LAKE = {"name": "lake", "kind": "iceberg", "topics": ["orders"]}


def test_a_sink_without_recovery_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"needs recovery \(recovery.enabled = true\)"):
        parse_config(cfg([LAKE], recovery={"enabled": False}))
    assert parse_config(cfg([], recovery={"enabled": False})).sinks == []


DB = {"name": "db", "kind": "postgres", "topics": ["orders"], "dsn": "postgresql://h/d"}


@pytest.mark.parametrize(
    ("sinks", "message"),
    [
        ([LAKE, LAKE], "two sinks share a name"),
        ([{**LAKE, "topics": ["nope"]}], "topic 'nope' is not consumed by any source"),
        ([{**LAKE, "topics": ["blobs"]}], "'blobs' has no decoded lane"),
        ([{**LAKE, "kind": "kafka"}], "kind"),
        ([{**LAKE, "partition_by": ["week(x)"]}], "is not day|hour|month|year|identity"),
        (
            [{"name": "f", "kind": "flight", "topics": ["orders"], "location": "http://x"}],
            "grpc://",
        ),
        ([{"name": "db", "kind": "postgres", "topics": ["orders"]}], "dsn"),
        ([{**LAKE, "commit_interval_s": 0}], "commit_interval_s"),
        ([{**DB, "mode": "upsert", "raw": True}], "set raw = false"),
        ([{**DB, "mode": "upsert", "table": "{tenant}_t"}], "a tombstone"),
        ([{**DB, "key": ["id"]}], "key applies to mode = 'upsert' only"),
        ([{**DB, "mode": "upsert", "key": ["id", "id"]}], "twice"),
        ([{**DB, "mode": "merge"}], "mode"),
    ],
)
def test_bad_sinks_are_refused_naming_the_problem(
    sinks: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(cfg(sinks))


def test_raw_sinks_take_topics_without_a_decoder_and_defaults_hold() -> None:
    c = parse_config(cfg([{**LAKE, "topics": ["blobs"], "raw": True}]))
    sink = c.sinks[0]
    assert isinstance(sink, IcebergSinkConfig)
    assert (sink.commit_interval_s, sink.catalog.type, sink.namespace) == (30.0, "sql", "thalweg")
    assert c.gateway.role == "both" and c.recovery.enabled and c.recovery.max_duty == 0.5


def test_sink_secrets_are_listed_and_never_shown() -> None:
    c = parse_config(
        cfg(
            [
                {
                    "name": "db",
                    "kind": "postgres",
                    "topics": ["orders"],
                    "dsn": "postgresql://u:pw@h/d",
                },
                {
                    **LAKE,
                    "catalog": {
                        "type": "rest",
                        "uri": "http://127.0.0.1:8181",
                        "token": "t0k",
                        "secret_properties": {"s3.secret-access-key": "sk"},
                    },
                },
                {
                    "name": "f",
                    "kind": "flight",
                    "topics": ["orders"],
                    "location": "grpc://h:1",
                    "token": "x",
                },
            ]
        )
    )
    assert c.secrets() == [
        "sinks.0.dsn",
        "sinks.1.catalog.token",
        "sinks.1.catalog.secret_properties.s3.secret-access-key",
        "sinks.2.token",
    ]
    shown = c.model_dump_json()
    assert "pw@" not in shown and "t0k" not in shown and '"sk"' not in shown


def test_an_upsert_without_key_is_keyed_by_the_record_key_and_reads_the_value() -> None:
    """No ``key``: the record key names a row, and the value comes along only so that a
    tombstone can be told (the sink drops it unless ``metadata`` asks for it)."""
    sink = parse_config(cfg([{**DB, "mode": "upsert", "metadata": ["ingest_ts"]}])).sinks[0]
    assert isinstance(sink, PostgresSinkConfig) and sink.record_keyed
    assert sink.row_key() == ["_twg_source_key"]
    assert sink.row_key("meta_source_key") == ["meta_source_key"]  # another prefix
    assert sink.read_metadata() == ["ingest_ts", "source_key", "source_value"]
    keyed = parse_config(cfg([{**DB, "mode": "upsert", "key": ["id"]}])).sinks[0]
    assert isinstance(keyed, PostgresSinkConfig) and not keyed.record_keyed
    assert keyed.row_key() == ["id"] and keyed.read_metadata() == keyed.metadata
