"""The upsert sinks' fold (``sinks/fold.py``): per key the row of the highest position,
keyless rows left out, the rest in lane order — against a fold written out by hand, for
one-column and two-column keys."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thalweg.records.columns import MetadataColumns
from thalweg.sinks.base import SinkRefusedError, SinkSchemaError
from thalweg.sinks.fold import newest_per_key, with_deletes

COLS = MetadataColumns()

ROWS = st.lists(
    st.tuples(st.one_of(st.none(), st.integers(0, 12)), st.sampled_from(["a", "b"])),
    min_size=1,
    max_size=300,
)


@settings(max_examples=200, deadline=None)
@given(rows=ROWS, shuffle=st.randoms(use_true_random=False))
def test_the_fold_is_each_keys_newest_row_in_lane_order(
    rows: list[tuple[int | None, str]], shuffle: object
) -> None:
    positions = list(range(len(rows)))
    shuffle.shuffle(positions)  # type: ignore[attr-defined]
    table = pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "t": [r[1] for r in rows],
            "_twg_position": pa.array(positions, pa.int64()),
            "row": list(range(len(rows))),
            # A row without a key is a delete naming no row (a tombstone): left out.
            "__deleted": [r[0] is None for r in rows],
        }
    )
    for key in (["id"], ["id", "t"]):
        newest: dict[tuple[object, ...], dict[str, object]] = {}
        for r in table.to_pylist():
            if r["id"] is None:
                continue
            k = tuple(r[c] for c in key)
            if k not in newest or r["_twg_position"] > newest[k]["_twg_position"]:  # type: ignore[operator]
                newest[k] = r
        want = sorted(newest.values(), key=lambda r: r["row"])  # type: ignore[arg-type, return-value]
        assert newest_per_key(table, key, "t", "s", COLS).to_pylist() == want


def test_rows_without_the_key_columns_are_refused_unless_they_are_all_deletes() -> None:
    tombstones = pa.table({"_twg_position": [1, 2], "__deleted": [True, True]})
    assert newest_per_key(tombstones, ["id"], "t", "s", COLS).num_rows == 0
    with pytest.raises(SinkSchemaError, match="'id'"):
        newest_per_key(
            tombstones.set_column(1, "__deleted", pa.array([True, False])), ["id"], "t", "s", COLS
        )


def test_a_changelog_tombstone_is_a_delete_and_the_value_goes_unless_kept() -> None:
    """Rows read with their value (an upsert by the record key): a null value is a
    delete; an envelope's own ``__deleted`` is left as it is."""
    rows = pa.table(
        {
            "_twg_source_key": [b"a", b"a", b"b"],
            "_twg_source_value": [b"{}", None, b"{}"],
            "_twg_position": [1, 2, 3],
        }
    )
    folded = newest_per_key(rows, ["_twg_source_key"], "t", "s", COLS, keep_value=False)
    assert folded.column_names == ["_twg_source_key", "_twg_position", "__deleted"]
    assert folded.to_pylist() == [
        {"_twg_source_key": b"a", "_twg_position": 2, "__deleted": True},
        {"_twg_source_key": b"b", "_twg_position": 3, "__deleted": False},
    ]
    kept = with_deletes(rows, COLS.value, keep_value=True)
    assert kept.column("__deleted").to_pylist() == [False, True, False]
    assert "_twg_source_value" in kept.column_names
    envelope = rows.append_column("__deleted", pa.array([True, False, False]))
    assert with_deletes(envelope, COLS.value, keep_value=True).column("__deleted").to_pylist() == [
        True,
        False,
        False,
    ]
    assert with_deletes(
        rows.drop_columns(["_twg_source_value"]), COLS.value, keep_value=False
    ).equals(rows.drop_columns(["_twg_source_value"]))


def test_a_row_that_is_not_a_delete_and_lacks_a_key_value_is_refused_by_name() -> None:
    """An update whose image has no key cannot name its row: refused with its record
    (set aside in the sink's dead-letter lane), never dropped in silence."""
    rows = pa.table(
        {
            "id": pa.array([1, None, None], pa.int64()),
            "_twg_position": [10, 11, 12],
            "_twg_source_partition": pa.array([0, 0, 3], pa.int32()),
            "__deleted": [False, False, True],
        }
    )
    with pytest.raises(SinkRefusedError, match=r"1 row\(s\) of 't' have no value") as e:
        newest_per_key(rows, ["id"], "t", "s", COLS)
    assert e.value.records == {("t", 0): {11}}
    no_column = rows.drop_columns(["id"])
    with pytest.raises(SinkRefusedError) as e:
        newest_per_key(no_column, ["id"], "t", "s", COLS)
    assert e.value.records == {("t", 0): {10, 11}}
