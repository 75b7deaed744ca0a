"""The latest view's fold (``flight/read/latest.py``): per (partition, record key) the
row of the highest position; tombstones, change-event deletes, keyless rows and records
that failed to decode leave nothing; folding as rows arrive gives what one fold would."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from thalweg.errors import InvariantError
from thalweg.flight.read import latest
from thalweg.flight.read.latest import fold_latest
from thalweg.records.columns import MetadataColumns

COLS = MetadataColumns()


def batch(rows: list[tuple[int, int, bytes | None, bytes | None, int | None]]) -> pa.RecordBatch:
    """Rows of (partition, position, key, value, v), decoded with every metadata column
    the fold reads."""
    return pa.RecordBatch.from_pydict(
        {
            "v": pa.array([r[4] for r in rows], pa.int64()),
            COLS.partition: pa.array([r[0] for r in rows], pa.int32()),
            COLS.position: pa.array([r[1] for r in rows], pa.int64()),
            COLS.source("key"): pa.array([r[2] for r in rows], pa.binary()),
            COLS.value: pa.array([r[3] for r in rows], pa.binary()),
            COLS.decode_error: pa.array(
                [None if r[4] is not None or r[3] is None else "syntax: x" for r in rows],
                pa.string(),
            ),
        }
    )


def test_each_key_keeps_its_newest_row_and_deletes_leave_nothing() -> None:
    got = fold_latest(
        [
            batch([(0, 0, b"a", b"1", 1), (0, 1, b"b", b"2", 2), (1, 0, b"a", b"9", 9)]),
            batch([(0, 2, b"a", b"3", 3), (0, 3, b"b", None, None), (0, 4, None, b"5", 5)]),
            batch([(0, 5, b"c", b"bad", None), (1, 1, b"c", b"7", 7)]),
        ],
        COLS,
    )
    assert got is not None
    # a@0 is 3, b@0 was deleted by a tombstone, the keyless row and the poison are out;
    # partition 1 keeps its own a and c.
    assert got.select(["v", COLS.partition]).to_pylist() == [
        {"v": 3, COLS.partition: 0},
        {"v": 9, COLS.partition: 1},
        {"v": 7, COLS.partition: 1},
    ]


def test_a_change_event_delete_removes_its_key() -> None:
    rows = batch([(0, 0, b"a", b"{}", 1), (0, 1, b"a", b"{}", 1)])
    table = pa.Table.from_batches([rows]).append_column("__deleted", pa.array([False, True]))
    assert fold_latest(table.to_batches(), COLS).num_rows == 0  # type: ignore[union-attr]


def test_folding_as_rows_arrive_is_one_fold(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    rows = []
    for pos in range(2000):
        key = rng.randrange(150)
        value = None if rng.random() < 0.1 else b"x"
        rows.append((key % 2, pos, b"k%d" % key, value, pos if value else None))
    batches = [batch(rows[i : i + 97]) for i in range(0, len(rows), 97)]
    whole = fold_latest(batches, COLS)
    monkeypatch.setattr(latest, "STEP_ROWS", 100)  # a step after every batch or two
    monkeypatch.setattr(latest, "FOLD_ROWS", 150)  # and the steps folded together often
    stepwise = fold_latest(batches, COLS)
    assert whole is not None and stepwise is not None
    assert whole.equals(stepwise)
    newest: dict[tuple[int, bytes], tuple[int, bytes | None]] = {}
    for p, pos, key, value, _ in rows:
        newest[(p, key)] = (pos, value)
    want = sorted((p, pos) for (p, _), (pos, value) in newest.items() if value is not None)
    got = zip(whole[COLS.partition].to_pylist(), whole[COLS.position].to_pylist(), strict=True)
    assert sorted(got) == want


def test_no_batches_is_no_table() -> None:
    assert fold_latest([], COLS) is None


def test_without_values_the_fold_keeps_only_whether_a_value_was_null() -> None:
    rows = [
        batch([(0, 0, b"a", b"1", 1), (0, 1, b"b", b"2", 2), (1, 0, b"a", b"9", 9)]),
        batch([(0, 2, b"a", None, None), (1, 1, b"c", b"7", 7), (0, 3, b"b", b"4", 4)]),
    ]
    whole = fold_latest(rows, COLS)
    slim = fold_latest(rows, COLS, values=False)
    assert whole is not None and slim is not None
    assert COLS.value not in slim.column_names  # the bytes are not held for the fold
    # a@0 was deleted by its tombstone either way; the rows left are the same.
    assert slim.select(["v", COLS.partition]).equals(whole.select(["v", COLS.partition]))
    assert slim.column("v").to_pylist() == [4, 9, 7]


def test_rows_out_of_position_order_are_refused_not_folded_wrong() -> None:
    # The fold keeps a key's last row: a read that sent a partition's rows backwards
    # would make an older row the newest.
    with pytest.raises(InvariantError, match="partition 0's rows came out of position order"):
        fold_latest([batch([(0, 5, b"a", b"1", 1)]), batch([(0, 3, b"a", b"2", 2)])], COLS)


def test_a_payload_field_named_like_the_folds_own_columns_is_kept_apart() -> None:
    # A payload may have any name outside the metadata prefix: the fold's tombstone
    # flag lives under the prefix, so a field called "_thalweg_tombstone" is a field.
    rows = pa.Table.from_batches(
        [batch([(0, 0, b"a", b"1", 1), (0, 1, b"b", b"2", 2), (0, 2, b"a", None, None)])]
    )
    rows = rows.append_column("_thalweg_tombstone", pa.array([True, True, False]))
    for values in (True, False):
        got = fold_latest(rows.to_batches(), COLS, values=values)
        assert got is not None
        assert got.column("v").to_pylist() == [2]  # a was deleted, b stays
        assert got.column("_thalweg_tombstone").to_pylist() == [True]


def test_rows_going_back_within_a_batch_are_refused_too() -> None:
    with pytest.raises(InvariantError, match="out of position order"):
        fold_latest([batch([(0, 5, b"a", b"1", 1), (0, 4, b"a", b"2", 2)])], COLS)
