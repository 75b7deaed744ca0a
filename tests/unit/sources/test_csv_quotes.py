"""Quotes read as pyarrow's CSV parser reads them (``thalweg.sources.files.quotes``)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow.csv as pacsv
import pytest

from thalweg.sources.files.quotes import count_holds, ends_inside_quotes, quoted_spans

Q, COMMA = ord('"'), ord(",")


def spans(text: bytes) -> list[tuple[int, int]]:
    quotes = np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == Q)
    opens, closes = quoted_spans(text, quotes, COMMA)
    return list(zip(opens, closes, strict=True))


@pytest.mark.parametrize(
    ("text", "expected", "holds"),
    [
        (b'a,"b\nc",d', [(2, 6)], True),  # a value over a line break
        (b'"a""b",c', [(0, 5)], True),  # a doubled quote stays inside
        (b'"",x', [(0, 1)], True),  # an empty value
        (b'12" pipe,"x"', [(9, 11)], False),  # a quote inside an unquoted field is text
        (b'"a"b"c",d', [(0, 2)], False),  # after the closing quote the field is text
        (b'x,"open\n', [(2, 8)], True),  # still open at the end
        (b'a""b,c', [], False),  # quotes in an unquoted field, even two
    ],
)
def test_quoted_values_open_only_at_a_fields_start(
    text: bytes, expected: list[tuple[int, int]], holds: bool
) -> None:
    assert spans(text) == expected
    arr = np.frombuffer(text, dtype=np.uint8)
    assert count_holds(arr, np.flatnonzero(arr == Q), COMMA) is holds


@pytest.mark.parametrize(
    ("record", "open_at_end"),
    [(b'1,"a"\n', False), (b'1,"a\n', True), (b'1,12" pipe\n', False), (b"1,2\n", False)],
)
def test_a_record_that_ends_inside_a_value(record: bytes, open_at_end: bool) -> None:
    assert ends_inside_quotes(record, Q, COMMA) is open_at_end
    # pyarrow agrees: an open value takes the line break in.
    row = pacsv.read_csv(
        io.BytesIO(record),
        read_options=pacsv.ReadOptions(column_names=["n", "v"]),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
    ).to_pylist()[0]
    assert str(row["v"]).endswith("\n") is open_at_end
