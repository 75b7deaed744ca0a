"""One topic into many tables (``sinks/routes.py``): rows split by the table their
fields name, rows without a value set apart with the reason, names made safe, and the
pattern that finds a routed sink's tables again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from thalweg.records.columns import MetadataColumns
from thalweg.sinks import ipc_routes
from thalweg.sinks.base import SinkRefusedError
from thalweg.sinks.routes import assign, pattern, routed, safe_name, split

COLS = MetadataColumns()


def test_rows_go_to_the_table_their_fields_name() -> None:
    rows = pa.table(
        {
            "tenant": ["acme", "bolt", None, "acme", "b-2"],
            "region": [1, 2, 3, 1, 2],
            "_twg_position": [0, 1, 2, 3, 4],
        }
    )
    parts, unnamed, why = split(rows, "{tenant}_{region}_{topic}", "orders.v1")
    assert {k: v["_twg_position"].to_pylist() for k, v in parts.items()} == {
        "acme_1_orders_v1": [0, 3],
        "bolt_2_orders_v1": [1],
        "b_2_2_orders_v1": [4],
    }
    assert unnamed["_twg_position"].to_pylist() == [2]
    assert why is not None and "1 row(s) have no value" in why


def test_a_missing_column_names_no_table_for_any_row() -> None:
    rows = pa.table({"n": [1, 2], "_twg_position": [0, 1]})
    parts, unnamed, why = split(rows, "{tenant}_orders", "t")
    assert parts == {} and unnamed.num_rows == 2
    assert why is not None and "no column 'tenant'" in why


def test_a_template_of_the_topic_alone_is_not_routed() -> None:
    assert not routed("{topic}") and not routed("fixed") and routed("{tenant}_orders")
    assert safe_name("a.b-c d") == "a_b_c_d"


def test_the_pattern_finds_the_tables_a_template_gives() -> None:
    like = pattern("{tenant}_orders_{topic}", "in.v1")
    assert like.match("acme_orders_in_v1") and like.match("b_2_orders_in_v1")
    assert not like.match("acme_orders_other") and not like.match("_orders_in_v1")


def test_a_path_keeps_its_own_text_and_makes_only_the_values_safe() -> None:
    """``whole=False`` (a Flight path, a directory): the template's ``/`` and ``-`` stay,
    a value's ``/`` does not split the path."""
    rows = pa.table({"tenant": ["a/b", "c-d"], "_twg_position": [0, 1]})
    parts, _, why = split(rows, "t-1/{tenant}/x", "orders", whole=False)
    assert why is None and sorted(parts) == ["t-1/a_b/x", "t-1/c_d/x"]


def test_a_routed_directory_template_has_its_control_directory_above_every_value(
    tmp_path: Path,
) -> None:
    template = str(tmp_path / "out" / "t_{tenant}" / "v{region}")
    assert ipc_routes.base(template) == tmp_path / "out"
    assert ipc_routes.control_dir(template) == tmp_path / "out" / "_thalweg_coverage"
    for made in ("t_a/v1", "t_b/v2", "_thalweg_coverage", "other/v1", "t_c"):
        (tmp_path / "out" / made).mkdir(parents=True)
    assert ipc_routes.dirs_of(template) == [
        str(tmp_path / "out" / "t_a" / "v1"),
        str(tmp_path / "out" / "t_b" / "v2"),
    ]
    assert ipc_routes.base(str(tmp_path / "x{a}")) == tmp_path


def _rows(tenants: list[str | None], topic_first: int = 0, deleted: bool = False) -> pa.Table:
    n = len(tenants)
    return pa.table(
        {
            "tenant": pa.array(tenants, pa.string()),
            "__deleted": [deleted] * n,
            "_twg_position": list(range(topic_first, topic_first + n)),
            "_twg_source_partition": pa.array([0] * n, pa.int32()),
        }
    )


def test_two_topics_naming_one_table_stay_apart_and_reserved_or_empty_names_are_refused() -> None:
    out = assign({"a": _rows(["x", "y"]), "b": _rows(["x"], 10)}, "{tenant}", set(), 5, "s", COLS)
    assert {k: v["_twg_position"].to_pylist() for k, v in out.items()} == {
        ("x", "a"): [0],
        ("y", "a"): [1],
        ("x", "b"): [10],
    }
    with pytest.raises(SinkRefusedError, match="_thalweg_coverage") as reserved:
        assign({"a": _rows(["_thalweg_coverage", "x"])}, "{tenant}", set(), 5, "s", COLS)
    assert reserved.value.records == {("a", 0): {0}}
    with pytest.raises(SinkRefusedError, match="no value") as empty:
        assign({"a": _rows(["", "x"])}, "out/{tenant}", set(), 5, "s", COLS, whole=False)
    assert empty.value.records == {("a", 0): {0}}


def test_an_upserts_delete_that_names_no_table_is_left_out_not_refused() -> None:
    tombstones = _rows([None, None], deleted=True)
    assert (
        assign({"a": tombstones}, "{tenant}", set(), 5, "s", COLS, deletes_name_nothing=True) == {}
    )
    with pytest.raises(SinkRefusedError):
        assign({"a": tombstones}, "{tenant}", set(), 5, "s", COLS)


def test_a_relative_template_finds_its_directories(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    for made in ("t-a", "t-b", "_thalweg_coverage", "u-a"):
        (tmp_path / made).mkdir()
    assert ipc_routes.base("t-{tenant}") == Path(".")
    assert ipc_routes.dirs_of("t-{tenant}") == ["t-a", "t-b"]
    assert ipc_routes.dirs_of("{tenant}") == ["t-a", "t-b", "u-a"]
