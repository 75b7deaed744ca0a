"""What a flush's schema changes in a live table's (``sinks/schema_change.py``): the
classification every table sink asks before its writer could cast silently."""

from __future__ import annotations

import pyarrow as pa
import pytest

from thalweg.sinks.schema_change import conflict, fits

TABLE = pa.schema(
    [
        ("n", pa.int32()),
        ("x", pa.float32()),
        ("s", pa.large_string()),
        ("id", pa.binary()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("addr", pa.struct([("zip", pa.int32()), ("city", pa.string())])),
        ("tags", pa.list_(pa.string())),
    ]
)


@pytest.mark.parametrize(
    "rows",
    [
        pa.schema([("n", pa.int16()), ("new", pa.string())]),  # narrower; added
        pa.schema([("s", pa.string()), ("id", pa.binary(16))]),  # other representations
        pa.schema([("s", pa.dictionary(pa.int8(), pa.string()))]),
        pa.schema([("at", pa.timestamp("ms", tz="+00:00")), ("n", pa.null())]),
        pa.schema([("addr", pa.struct([("zip", pa.int16()), ("street", pa.string())]))]),
        pa.schema([("tags", pa.large_list(pa.string())), ("n", pa.uint16())]),
    ],
)
def test_rows_the_table_takes_as_they_are_are_no_conflict(rows: pa.Schema) -> None:
    assert conflict(TABLE, rows) is None


@pytest.mark.parametrize(
    ("rows", "column", "widening"),
    [
        (pa.schema([("n", pa.int64())]), "n", True),
        (pa.schema([("x", pa.float64())]), "x", True),
        (pa.schema([("n", pa.uint32())]), "n", False),  # needs 33 bits, and no negatives
        (pa.schema([("s", pa.int64())]), "s", False),
        (pa.schema([("n", pa.string())]), "n", False),
        (pa.schema([("x", pa.int32())]), "x", False),  # an int is not read as a float
        (pa.schema([("at", pa.timestamp("us"))]), "at", False),  # the zone lost
        (pa.schema([("addr", pa.struct([("zip", pa.string())]))]), "addr.zip", False),
        (pa.schema([("tags", pa.list_(pa.int64()))]), "tags[]", False),
    ],
)
def test_a_changed_column_is_named_with_both_types(
    rows: pa.Schema, column: str, widening: bool
) -> None:
    found = conflict(TABLE, rows)
    assert found is not None
    assert (found.column, found.widening) == (column, widening)
    assert repr(column) in found.describe() and str(found.rows) in found.describe()


def test_unsigned_and_signed_integers_fit_by_their_range() -> None:
    assert fits(pa.uint8(), pa.int16()) and not fits(pa.uint16(), pa.int16())
    assert fits(pa.uint8(), pa.uint64()) and not fits(pa.int8(), pa.uint64())
    assert fits(pa.decimal128(10, 2), pa.decimal128(12, 2))
    assert not fits(pa.decimal128(10, 2), pa.decimal128(12, 3))
