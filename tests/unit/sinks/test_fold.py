"""The upsert sinks' fold (``sinks/fold.py``): per key the row of the highest position,
keyless rows left out, the rest in lane order — against a fold written out by hand, for
one-column and two-column keys."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thalweg.sinks.base import SinkSchemaError
from thalweg.sinks.fold import newest_per_key

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
        assert newest_per_key(table, key, "t", "s").to_pylist() == want


def test_rows_without_the_key_columns_are_refused_unless_they_are_all_deletes() -> None:
    tombstones = pa.table({"_twg_position": [1, 2], "__deleted": [True, True]})
    assert newest_per_key(tombstones, ["id"], "t", "s").num_rows == 0
    with pytest.raises(SinkSchemaError, match="'id'"):
        newest_per_key(
            tombstones.set_column(1, "__deleted", pa.array([True, False])), ["id"], "t", "s"
        )
