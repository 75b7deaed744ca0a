"""JSON decoding: aligned rows, per-record failures with reasons, a pinned schema."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from thalweg.codecs import DecodeReason, JsonArrowDecoder
from thalweg.records import MetadataColumns


def decode(values: list[bytes | None], d: JsonArrowDecoder | None = None):  # type: ignore[no-untyped-def]
    d = d or JsonArrowDecoder(MetadataColumns())
    return d, d.decode(pa.array(values, pa.binary()))


def reasons(result) -> dict[int, DecodeReason]:  # type: ignore[no-untyped-def]
    return {f.row: f.reason for f in result.failures}


def test_good_bad_and_tombstones_stay_aligned() -> None:
    values = [
        b'{"a": 1, "n": {"x": 1}}',
        None,
        b"",
        b"   ",
        b'{"a":\n 2}',
        b"not json",
        b'{"a": 1} {"a": 2}',
        b"5",
        b'{"a": 3, "b": true}',
    ]
    _, r = decode(values)
    assert r.table.num_rows == len(values)
    assert r.table.column("a").to_pylist() == [1, None, None, None, 2, None, None, None, 3]
    assert reasons(r) == {
        2: DecodeReason.EMPTY,
        3: DecodeReason.EMPTY,
        5: DecodeReason.SYNTAX,
        6: DecodeReason.NOT_ONE_RECORD,
        7: DecodeReason.NOT_ONE_RECORD,
    }
    errors = r.errors.to_pylist()
    assert errors[1] is None and errors[0] is None  # a tombstone is not an error
    assert errors[5].startswith("syntax:")


def test_schema_is_pinned_and_conflicts_fail_alone() -> None:
    d, _ = decode([b'{"id": 1, "name": "a"}'])
    _, r = decode([b'{"id": "x"}', b'{"id": 2, "extra": [1]}'], d)
    assert reasons(r) == {0: DecodeReason.TYPE_CONFLICT}
    assert r.table.column("id").to_pylist() == [None, 2]
    assert d.schema.field("id").type == pa.int64()
    assert d.schema.names == ["id", "name", "extra"]


def test_fields_first_seen_empty_get_their_type_later() -> None:
    d, _ = decode([b'{"tags": [], "s": {"a": null}}'])
    _, r = decode([b'{"tags": ["x"], "s": {"a": 1}}'], d)
    assert r.failures == ()
    assert d.schema.field("tags").type == pa.list_(pa.string())


def test_reserved_prefix_is_a_hard_error() -> None:
    _, r = decode([b'{"_twg_source_offset": 5, "a": 1}', b'{"a": 2}'])
    assert reasons(r) == {0: DecodeReason.RESERVED_FIELD}
    assert "_twg_source_offset" not in r.table.column_names
    assert r.table.column("a").to_pylist() == [None, 2]


def test_many_poison_records_are_all_found() -> None:
    values: list[bytes | None] = [json.dumps({"i": i}).encode() for i in range(5000)]
    bad = set(range(0, 5000, 97))
    for i in bad:
        values[i] = b'{"i": '
    _, r = decode(values)
    assert set(reasons(r)) == bad
    got = r.table.column("i").to_pylist()
    assert all(got[i] == i for i in range(5000) if i not in bad)


def test_declared_json_schema_wins_over_inference() -> None:
    from thalweg.codecs.typemap import json_schema_record

    declared = json_schema_record(
        {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "price": {"type": ["number", "null"]},
                "at": {"type": "string", "format": "date-time"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
        }
    )
    d = JsonArrowDecoder(MetadataColumns(), declared, declared=True)
    r = d.decode(
        pa.array(
            [
                b'{"id": 1, "price": 2, "at": "2026-11-30T12:00:00Z", "tags": ["a"], "extra": 1}',
                b'{"id": "one"}',
                b'{"id": 3}',
            ]
        )
    )
    assert reasons(r) == {1: DecodeReason.TYPE_CONFLICT}
    assert r.table.schema == declared  # no inferred "extra", price stays double
    assert r.table.column("price").to_pylist() == [2.0, None, None]
    noon = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
    assert r.table.column("at").to_pylist()[0] == noon
    assert d.schema == declared


def _pinned() -> JsonArrowDecoder:
    """A decoder whose lane has ``id: int64`` and two fields so far seen only empty
    (``s: struct<a: null>``, ``tags: list<null>``): payloads infer those, so a conflict
    with them is found when pieces are fitted to the lane schema, not while parsing."""
    d, _ = decode([b'{"id": 1, "s": {"a": null}, "tags": []}'])
    return d


GOOD_ROWS = [b'{"id": %d}', b'{"id": %d, "tags": ["x"]}', b'{"id": %d, "s": {"a": 7}}']
BAD_ROWS = [b'{"id": %d, "s": 5}', b'{"id": %d, "tags": 3}', b'{"id": "%d"}']


def test_a_type_conflict_fails_its_own_row_not_its_neighbours() -> None:
    """One row contradicting an inferred field's pinned type: parsed together, the rows
    form one piece that does not fit the lane schema; only the contradicting row fails."""
    values = [b'{"id": 2}', b'{"id": 3, "s": 5}', b'{"id": 4}', b'{"id": 5, "tags": ["x"]}']
    d = _pinned()
    _, r = decode(values, d)
    assert reasons(r) == {1: DecodeReason.TYPE_CONFLICT}
    assert r.table.column("id").to_pylist() == [2, None, 4, 5]
    assert r.table.column("tags").to_pylist() == [None, None, None, ["x"]]
    assert d.schema.field("s").type == pa.struct([("a", pa.null())])  # not changed by row 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2)), min_size=1, max_size=40))
def test_each_row_fails_or_decodes_on_its_own_merits(rows: list[tuple[bool, int]]) -> None:
    """Per-row isolation: whatever a batch mixes, exactly the contradicting rows fail (as
    type conflicts) and every other row decodes to its own id."""
    values: list[bytes | None] = [
        (BAD_ROWS if bad else GOOD_ROWS)[kind] % (100 + i) for i, (bad, kind) in enumerate(rows)
    ]
    _, r = decode(values, _pinned())
    bad_rows = {i for i, (bad, _) in enumerate(rows) if bad}
    assert reasons(r) == dict.fromkeys(bad_rows, DecodeReason.TYPE_CONFLICT)
    ids = r.table.column("id").to_pylist()
    assert ids == [None if i in bad_rows else 100 + i for i in range(len(rows))]


def test_line_breaks_are_found_only_within_the_values_asked_about() -> None:
    from thalweg.codecs.json import _has_line_breaks

    values = pa.array([b'{"a": 1}', b'{"a":\r\n 2}', b'{"a": 3}'], pa.binary())
    assert _has_line_breaks(values)
    assert not _has_line_breaks(values.slice(2))
    assert not _has_line_breaks(values.slice(0, 1))
    assert _has_line_breaks(values.slice(1, 1))
    assert _has_line_breaks(pa.array(['{"a":\n1}'], pa.large_string()))
    assert not _has_line_breaks(pa.array([], pa.binary()))


def test_line_breaks_are_found_in_any_slice_of_a_large_batch() -> None:
    from thalweg.codecs import json as codec

    filler = b'{"a": "' + b"x" * 1000 + b'"}'
    rows = [filler] * (3 * codec._LINE_SCAN // len(filler))
    for at in (0, len(rows) // 2, len(rows) - 1):  # first, a middle and the last slice
        values = pa.array([*rows[:at], b'{"a":\n1}', *rows[at + 1 :]], pa.binary())
        assert codec._has_line_breaks(values)
        assert not codec._has_line_breaks(values.slice(at + 1))
    assert not codec._has_line_breaks(pa.array(rows, pa.binary()))
