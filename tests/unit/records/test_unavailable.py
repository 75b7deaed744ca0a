"""Keeping the current value of the columns a change event did not carry
(``records/unavailable.py``): from the flush's earlier rows since the key's last
delete, then from the destination's row; still unknown stays null and named."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from thalweg.records.unavailable import UNAVAILABLE, from_flush, from_held, named, unresolved

P = "_twg_position"


def table(*rows: dict[str, Any]) -> pa.Table:
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("bio", pa.string()),
            ("n", pa.int64()),
            ("__deleted", pa.bool_()),
            (UNAVAILABLE, pa.list_(pa.string())),
            (P, pa.int64()),
        ]
    )
    full = [{"bio": None, "n": None, "__deleted": False, UNAVAILABLE: None, **r} for r in rows]
    return pa.Table.from_pylist(full, schema)


def test_the_flush_fills_from_the_keys_last_carried_value_since_its_delete() -> None:
    rows = table(
        {"id": 1, "bio": "a", "n": 1, P: 0},
        {"id": 1, "bio": "b", "n": 2, P: 1},
        {"id": 1, "n": 3, UNAVAILABLE: ["bio"], P: 2},
        {"id": 2, "bio": "x", "n": 1, P: 3},
        {"id": 2, "__deleted": True, P: 4},
        {"id": 2, "n": 2, UNAVAILABLE: ["bio"], P: 5},  # after a delete: no value
        {"id": 3, UNAVAILABLE: ["bio", "n"], P: 6},  # nothing earlier here
        {"id": 4, "bio": "q", "n": None, UNAVAILABLE: ["n"], P: 7},
        {"id": 4, "bio": "r", UNAVAILABLE: ["n"], P: 8},  # the earlier row lacked n too
    )
    newest = rows.take([2, 5, 6, 8])
    got = from_flush(rows, newest, ["id"], P).select(["id", "bio", "n", UNAVAILABLE])
    assert got.to_pylist() == [
        {"id": 1, "bio": "b", "n": 3, UNAVAILABLE: None},
        {"id": 2, "bio": None, "n": 2, UNAVAILABLE: None},
        {"id": 3, "bio": None, "n": None, UNAVAILABLE: ["bio", "n"]},
        {"id": 4, "bio": "r", "n": None, UNAVAILABLE: ["n"]},
    ]
    assert named(got) == ["bio", "n"]
    assert unresolved(got).column("id").to_pylist() == [3, 4]


def test_the_destinations_older_row_fills_what_the_flush_could_not() -> None:
    newest = table(
        {"id": 3, UNAVAILABLE: ["bio", "n"], P: 6},
        {"id": 4, "bio": "r", UNAVAILABLE: ["n"], P: 8},
        {"id": 5, UNAVAILABLE: ["bio"], P: 9},
    )
    held = table(
        {"id": 3, "bio": "kept", "n": 5, P: 1},
        {"id": 4, "bio": "old", UNAVAILABLE: ["n"], P: 2},  # unknown there as well
        {"id": 5, "bio": "newer", P: 10},  # newer than the row: not a source
    )
    got = from_held(newest, held, ["id"], P).select(["id", "bio", "n", UNAVAILABLE])
    assert got.to_pylist() == [
        {"id": 3, "bio": "kept", "n": 5, UNAVAILABLE: None},
        {"id": 4, "bio": "r", "n": None, UNAVAILABLE: ["n"]},
        {"id": 5, "bio": None, "n": None, UNAVAILABLE: ["bio"]},
    ]
