"""The transform DAG's shape and SQL nodes: configuration refusals name the node; a
query is planned against its input at start; locators ride through filters (1 → 0) and
unnest (1 → N); a query that drops them is refused. (Feeding nodes is not built yet.)"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from thalweg.config import parse_config
from thalweg.errors import ConfigError
from thalweg.pipeline.dag import Dag, SqlNode, expand_prefix_glob
from thalweg.records.columns import MetadataColumns

COLS = MetadataColumns("_twg_")


def cfg(nodes: list[dict[str, Any]], sinks: list[dict[str, Any]] | None = None) -> Any:
    return parse_config(
        {
            "sources": [
                {
                    "name": "k",
                    "kind": "kafka",
                    "bootstrap_servers": "127.0.0.1:1",
                    "topics": ["orders"],
                }
            ],
            "sinks": sinks or [],
            "pipeline": {"nodes": nodes},
        }
    )


CLEAN = {
    "name": "clean",
    "from": "orders",
    "query": "select amount, _twg_* from input where amount > 0",
}
LINES = {"name": "lines", "from": "clean", "query": "select unnest(items) as line, * from input"}


def orders() -> pa.Table:
    locators = {f.name: pa.nulls(3, f.type) for f in COLS.locator_fields}
    locators["_twg_position"] = pa.array([10, 11, 12], pa.int64())
    locators["_twg_record_id"] = pa.array([bytes([i]) * 16 for i in range(3)], pa.binary(16))
    return pa.table(
        {
            "amount": pa.array([5, -1, 7], pa.int64()),
            "items": pa.array([["a", "b"], ["c"], []], pa.list_(pa.string())),
            **locators,
        }
    )


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([{**CLEAN, "from": "nope"}], "from = 'nope' is neither a consumed topic nor a node"),
        ([CLEAN, CLEAN], "two nodes share a name"),
        ([{**CLEAN, "from": "lines"}, LINES], "a cycle: clean -> lines -> clean"),
        ([{**CLEAN, "sink": "lake"}], "sink = 'lake' is not a \\[\\[sinks\\]\\] name"),
        ([{"name": "x", "from": "orders"}], "give one of query, sidecar, contract or audit"),
        ([{"name": "x", "from": "orders", "sidecar": "grpc://127.0.0.1:9"}], "needs a command"),
    ],
)
def test_the_graph_is_checked_with_the_file(nodes: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cfg(nodes)


def test_a_node_cannot_take_a_topics_name() -> None:
    with pytest.raises(ConfigError, match="cannot share a topic's name"):
        parse_config(
            {
                "sources": [
                    {
                        "name": "k",
                        "kind": "kafka",
                        "bootstrap_servers": "127.0.0.1:1",
                        "topics": ["orders", "payments"],
                    }
                ],
                "pipeline": {"nodes": [{**CLEAN, "name": "payments"}]},
            }
        )


def test_order_dependents_and_materialisation() -> None:
    scored = {"name": "scored", "from": "clean", "sidecar": "grpc://127.0.0.1:9", "command": "s"}
    dag = Dag.of(cfg([LINES, scored, CLEAN]).pipeline)
    assert [n.name for n in dag.nodes] == ["clean", "lines", "scored"]
    assert dag.dependents("clean") == ["lines", "scored"]
    assert dag.materialised("clean") and not dag.materialised("lines")
    assert dag.source_topic("lines") == "orders"


def test_sql_nodes_keep_locators_through_filters_and_unnest() -> None:
    table = orders()
    clean = SqlNode(Dag.of(cfg([CLEAN]).pipeline).node("clean"), table.schema, COLS)
    out = clean.run(table)
    assert out.column("amount").to_pylist() == [5, 7]  # 1 → 0 for the negative amount
    assert out.column("_twg_position").to_pylist() == [10, 12]
    assert {f.name for f in COLS.locator_fields} <= set(out.column_names)
    with_items = SqlNode(
        Dag.of(cfg([{**CLEAN, "query": "select amount, items, _twg_* from input"}]).pipeline).node(
            "clean"
        ),
        table.schema,
        COLS,
    ).run(table)
    lines = SqlNode(Dag.of(cfg([CLEAN, LINES]).pipeline).node("lines"), with_items.schema, COLS)
    out = lines.run(with_items)
    assert out.column("line").to_pylist() == ["a", "b", "c"]  # 1 → N, 1 → N, 1 → 0
    assert out.column("_twg_position").to_pylist() == [10, 10, 11]
    assert lines.run(with_items.slice(0, 0)).num_rows == 0


def test_sql_that_does_not_plan_or_drops_locators_is_refused_naming_the_node() -> None:
    schema = orders().schema
    bad = {**CLEAN, "query": "select nope from input"}
    with pytest.raises(
        ConfigError, match=r"pipeline\.nodes\.clean: the query does not plan: .*nope"
    ):
        SqlNode(Dag.of(cfg([bad]).pipeline).node("clean"), schema, COLS)
    dropped = {**CLEAN, "query": "select amount, _twg_position from input"}
    with pytest.raises(ConfigError, match=r"drops locator columns .*_twg_record_id"):
        SqlNode(Dag.of(cfg([dropped]).pipeline).node("clean"), schema, COLS)


def test_the_prefix_glob_expands_to_the_inputs_metadata_columns() -> None:
    schema = pa.schema([("a", pa.int64()), ("_twg_position", pa.int64()), ("_twg_x", pa.int8())])
    q = expand_prefix_glob("select a, _twg_* from input", schema, COLS)
    assert q == 'select a, "_twg_position", "_twg_x" from input'
    assert expand_prefix_glob("select a from input", schema, COLS) == "select a from input"
    # Not inside a string literal or a quoted identifier.
    q = "select a, '_twg_*' as lit, \"_twg_*\" from input where b = 'it''s _twg_*'"
    assert expand_prefix_glob(q, schema, COLS) == q


def test_twg_stream_refuses_nodes_that_feed_no_sink(tmp_path: Any) -> None:
    from thalweg.engine import Gateway

    c = cfg([CLEAN]).model_copy(
        update={"gateway": cfg([]).gateway.model_copy(update={"data_dir": tmp_path})}
    )
    with pytest.raises(ConfigError, match="nothing is fed from this node"):
        Gateway(c)


def test_nodes_need_a_decoded_lane_and_patterns_match_whole_names() -> None:
    pulsar = {
        "name": "p",
        "kind": "pulsar",
        "service_url": "pulsar://127.0.0.1:1",
        "topics_pattern": "orders.*",
    }
    raw = {
        "name": "r",
        "kind": "kafka",
        "bootstrap_servers": "127.0.0.1:1",
        "topics": ["blobs"],
        "format": "none",
    }

    def parse(nodes: list[dict[str, Any]]) -> Any:
        return parse_config({"sources": [pulsar, raw], "pipeline": {"nodes": nodes}})

    ok = parse([{"name": "eu", "from": "orders-eu", "query": "select * from input"}])
    assert ok.source_of("orders-eu") is not None and ok.source_of("x-orders-eu") is None
    with pytest.raises(ConfigError, match="from = 'ordrs-eu' is neither"):
        parse([{"name": "eu", "from": "ordrs-eu", "query": "select * from input"}])
    with pytest.raises(ConfigError, match="cannot share a topic's name"):
        parse([{"name": "orders_x", "from": "orders-eu", "query": "q"}])
    with pytest.raises(ConfigError, match="'blobs' has no decoded lane"):
        parse([{"name": "b", "from": "blobs", "query": "select * from input", "materialise": True}])
