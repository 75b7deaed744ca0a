"""File readers, file-row batches and their decoder, on files written here."""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thalweg.codecs.base import DecodeReason
from thalweg.codecs.rows import ArrowRowDecoder
from thalweg.pipeline.decode import decode_batch
from thalweg.records.columns import MetadataColumns
from thalweg.records.file_rows import BrokenRow, file_rows_batch, row_bytes, strip_payload
from thalweg.sources.files.formats import (
    CsvOptions,
    FileReadError,
    detect,
    read_chunks,
)
from thalweg.sources.files.formats.records import split_records
from thalweg.sources.files.lane_ready import unique_names
from thalweg.sources.files.source import FileSource

C = MetadataColumns()
LOCAL = pafs.LocalFileSystem()


def read_all(path: Path, fmt: str, start: int = 0) -> tuple[pa.Table, list[int], list[BrokenRow]]:
    tables, numbers, broken = [], [], []
    for chunk in read_chunks(LOCAL, str(path), fmt, start):
        tables.append(chunk.table)
        numbers += chunk.rows.tolist()
        broken += chunk.broken
    table = pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})
    return table, numbers, broken


def test_formats_are_told_by_suffix_through_compression() -> None:
    assert detect("/x/a.CSV.gz") == "csv"
    assert detect("s3://b/k/part-0.parquet") == "parquet"
    assert detect("d.ndjson.zst") == "jsonl"
    assert detect("e.feather") == "arrow"
    assert detect("f.txt") is None


@given(
    st.lists(
        st.lists(st.text(alphabet='ab,"\n x', max_size=6), min_size=2, max_size=2),
        max_size=20,
    ),
    st.integers(min_value=1, max_value=64),
)
@settings(max_examples=200, deadline=None)
def test_csv_records_split_like_a_csv_parser_reads_them(cells: list[list[str]], piece: int) -> None:
    """The quote-aware splitter finds the records Python's csv module writes, whatever
    the bytes are cut into (records never split across reads)."""
    import csv

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    kept = [row for row in cells if any(row)]  # csv writes an all-empty row as a blank
    for row in kept:
        w.writerow(row)
    data = buf.getvalue().encode()
    found: list[bytes] = []
    rest = b""
    for i in range(0, len(data) + 1, piece):
        rest += data[i : i + piece]
        eof = i + piece >= len(data)
        recs = split_records(rest, ord('"'), eof)
        found += [recs.text(k) for k in range(len(recs.starts))]
        rest = rest[recs.consumed :]
        if eof:
            break
    parsed = [next(csv.reader([r.decode()])) for r in found]
    assert parsed == [r for r in kept if r != ["", ""]]


@given(
    st.lists(st.sampled_from(["a", "b", ",", '"', "'", "\n", " ", "\r\n", "\r"]), max_size=30),
    st.booleans(),
    st.sampled_from(['"', "'", ""]),
)
@settings(max_examples=400, deadline=None)
def test_records_and_the_header_are_those_a_csv_reader_finds(
    tokens: list[str], header: bool, quote: str
) -> None:
    """Whatever the quotes — doubled, unclosed, or inside an unquoted field, where the
    parser takes them for text — the records are those Python's csv reader finds, the
    header is the first, and the cheap cut (``bytes.count`` parity) agrees with the
    splitter wherever the parity holds."""
    import csv

    from thalweg.sources.files import formats

    opts = formats.CsvOptions(header=header, quote=quote)
    q = opts.quote_byte
    buf = "".join(tokens).encode()
    assert formats.records._record_end(buf, q) == split_records(buf, q, False).consumed
    dialect: dict[str, Any] = {"quotechar": quote} if quote else {"quoting": csv.QUOTE_NONE}
    expected = [r for r in csv.reader(io.StringIO(buf.decode(), newline=""), **dialect) if r]
    recs = split_records(buf, q, True, delim=ord(","))
    found = [recs.text(k).decode() for k in range(len(recs.starts))]
    assert [opts.fields(r) for r in found] == expected
    names, rest = formats.csv._csv_header(buf, opts)
    if not expected:
        assert names is None
        return
    named = unique_names(expected[0])
    assert names == (named if header else [f"f{i}" for i in range(len(expected[0]))])
    if header:  # what follows is every later record, in order
        later = split_records(rest, q, True, delim=ord(","))
        assert [later.text(k).decode() for k in range(len(later.starts))] == found[1:]


@given(
    st.lists(
        st.sampled_from(["a", "b", " ", ",", '"', "'", "\n", "\r\n", "\r", "\ufeff"]), max_size=40
    ),
    st.sampled_from(['"', "'", ""]),
    st.booleans(),
    st.integers(min_value=1, max_value=24),
)
@settings(max_examples=600, deadline=None)
def test_csv_rows_do_not_depend_on_where_pieces_are_cut(
    tokens: list[str], quote: str, header: bool, piece: int
) -> None:
    """Row numbers are positions a resumed run seeks to: a file read in pieces of a few
    bytes gives the same rows, values and broken rows as read in one piece — and, when
    no row is broken, the rows pyarrow reads from the whole file."""
    import tempfile

    import pyarrow.csv as pacsv

    from thalweg.sources.files import formats

    body = "".join(tokens).encode()
    opts = CsvOptions(header=header, quote=quote)

    def read(chunk_bytes: int) -> tuple[dict[int, object], list[tuple[int, bytes]]]:
        formats.base.CHUNK_BYTES = chunk_bytes
        with tempfile.NamedTemporaryFile(suffix=".csv") as f:
            f.write(body)
            f.flush()
            try:
                chunks = list(read_chunks(LOCAL, f.name, "csv", 0, opts))
            except FileReadError as exc:  # refused either way
                return {-1: type(exc).__name__}, []
        rows: dict[int, object] = {}
        for c in chunks:
            values = zip(*(col.to_pylist() for col in c.table.columns), strict=True)
            for n, v in zip(c.rows.tolist(), values, strict=True):
                rows[n] = tuple("" if x is None else str(x) for x in v)
        return rows, [(b.row, b.text) for c in chunks for b in c.broken]

    whole = formats.base.CHUNK_BYTES
    try:
        rows, broken = read(whole)
        assert read(piece) == (rows, broken)
    finally:
        formats.base.CHUNK_BYTES = whole
    try:
        table = pacsv.read_csv(
            io.BytesIO(body),
            read_options=pacsv.ReadOptions(autogenerate_column_names=not header),
            parse_options=opts.parse_options(),
        )
    except pa.ArrowInvalid:
        return
    if not broken:
        values = zip(*(col.to_pylist() for col in table.columns), strict=True)
        assert rows == {
            n: tuple("" if x is None else str(x) for x in v) for n, v in enumerate(values)
        }


def test_a_quote_inside_an_unquoted_field_is_text_and_holds_nothing_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``12" pipe`` turns the quote count for the rest of the file (every later value is
    quoted); the parser reads the quote as text. The file is still read in pieces of
    about the chunk size (not held whole), every row as pyarrow reads the file, and a
    broken row further on is that one row."""
    import pyarrow.csv as pacsv

    from thalweg.sources.files import formats

    monkeypatch.setattr(formats.base, "CHUNK_BYTES", 4096)
    lines = ["id,item,note"] + [f'{i},"item {i}","n, {i}"' for i in range(20_000)]
    lines[10] = '9,12" pipe,"a\nb"'
    lines[15_001] = '15000,"x","y",extra'
    p = tmp_path / "a.csv"
    p.write_text("\n".join(lines) + "\n")
    chunks = list(read_chunks(LOCAL, str(p), "csv"))
    assert len(chunks) > p.stat().st_size // (3 * 4096)
    assert max(c.nbytes for c in chunks) < 3 * 4096
    table = pa.concat_tables([c.table for c in chunks])
    numbers = [int(r) for c in chunks for r in c.rows]
    broken = [(b.row, b.text) for c in chunks for b in c.broken]
    assert broken == [(15_000, b'15000,"x","y",extra')]
    assert numbers == [i for i in range(20_000) if i != 15_000]
    whole = pacsv.read_csv(
        io.BytesIO("\n".join(lines[:15_001] + lines[15_002:]).encode()),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
    )
    assert table.to_pylist() == whole.to_pylist()
    assert table["item"][9].as_py() == '12" pipe' and table["note"][9].as_py() == "a\nb"


def test_lines_that_end_in_a_lone_carriage_return_are_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Classic Mac OS line ends (Excel's "CSV (Macintosh)"): pyarrow's parser ends a
    record at a lone CR, and so does the reader — in pieces, not the file held whole."""
    import pyarrow.csv as pacsv

    from thalweg.sources.files import formats

    monkeypatch.setattr(formats.base, "CHUNK_BYTES", 4096)
    lines = ["id,note"] + [f'{i},"n\r{i}"' if i % 100 == 7 else f"{i},n {i}" for i in range(5_000)]
    lines[3_001] = "3000,x,extra"
    p = tmp_path / "mac.csv"
    p.write_bytes("\r".join(lines).encode() + b"\r")
    chunks = list(read_chunks(LOCAL, str(p), "csv"))
    assert len(chunks) > p.stat().st_size // (3 * 4096)
    assert [(b.row, b.text) for c in chunks for b in c.broken] == [(3_000, b"3000,x,extra")]
    numbers = [int(r) for c in chunks for r in c.rows]
    assert numbers == [i for i in range(5_000) if i != 3_000]
    whole = pacsv.read_csv(
        io.BytesIO("\r".join(lines[:3_001] + lines[3_002:]).encode()),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
    )
    assert pa.concat_tables([c.table for c in chunks]).to_pylist() == whole.to_pylist()
    assert whole["note"][7].as_py() == "n\r7"


def test_a_row_longer_than_a_parser_block_is_a_row_not_a_dead_letter(tmp_path: Path) -> None:
    """pyarrow refuses a row that straddles two parser blocks; the careful CSV path
    (taken for the broken row beside it) and JSON lines size blocks to the longest."""
    from thalweg.sources.files import formats

    long = formats.base.PARSE_BLOCK * 3
    p = tmp_path / "a.csv"
    p.write_text(f'id,v\n0,a\n1,{"x" * long}\n2,b,extra\n3,"{"y" * long}"\n')
    table, numbers, broken = read_all(p, "csv")
    assert numbers == [0, 1, 3]
    assert [len(v) for v in table["v"].to_pylist()] == [1, long, long]
    assert [(b.row, b.message) for b in broken] == [(2, "expected 2 columns, got 3")]
    p = tmp_path / "a.jsonl"
    p.write_text(
        "\n".join(json.dumps({"id": i, "v": "z" * (long if i == 1 else 1)}) for i in range(3))
    )
    table, numbers, broken = read_all(p, "jsonl")
    assert numbers == [0, 1, 2] and broken == []
    assert [len(v) for v in table["v"].to_pylist()] == [1, long, 1]


@pytest.mark.parametrize("text", ['[\n  {"id": 1},\n  {"id": 2}\n]\n', '\ufeff [{"id": 1}]'])
def test_a_json_array_is_refused_as_a_file_not_dead_lettered_line_by_line(
    tmp_path: Path, text: str
) -> None:
    p = tmp_path / "export.json"
    p.write_text(text)
    with pytest.raises(FileReadError, match=r"a JSON array, not JSON lines.*jq -c"):
        read_all(p, "jsonl")


@pytest.mark.parametrize(
    ("names", "unique"),
    [
        (["id", "name", "name", ""], ["id", "name", "name_2", "f3"]),
        (["a", "a", "a_2"], ["a", "a_3", "a_2"]),
        (["", "f0"], ["f0_2", "f0"]),
        (["a", "b"], ["a", "b"]),
    ],
)
def test_every_column_gets_a_name_of_its_own(names: list[str], unique: list[str]) -> None:
    assert unique_names(names) == unique


def test_repeated_and_empty_column_names_keep_every_value(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text("id,name,name,\n1,a,b,c\n")
    table, _, _ = read_all(p, "csv")
    assert table.to_pylist() == [{"id": 1, "name": "a", "name_2": "b", "f3": "c"}]
    p = tmp_path / "a.arrow"
    t = pa.table([pa.array([1]), pa.array(["x"]), pa.array(["y"])], names=["v", "v", ""])
    with pa.ipc.new_file(str(p), t.schema) as w:
        w.write_table(t)
    table, _, _ = read_all(p, "arrow")
    assert table.to_pylist() == [{"v": 1, "v_2": "x", "f2": "y"}]


def test_a_resumed_csv_read_types_its_columns_as_the_whole_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first piece's types hold for the file, also when a resumed read starts
    pieces later: a column of whole numbers after a first piece with fractions stays
    double, as in the run that was cut."""
    from thalweg.sources.files import formats

    monkeypatch.setattr(formats.base, "CHUNK_BYTES", 256)
    p = tmp_path / "a.csv"
    p.write_text(
        "v\n" + "".join(f"{i}.5\n" for i in range(50)) + "".join(f"{i}\n" for i in range(500))
    )
    whole, _, _ = read_all(p, "csv")
    resumed, numbers, _ = read_all(p, "csv", start=400)
    assert whole.schema.field("v").type == resumed.schema.field("v").type == pa.float64()
    assert numbers == list(range(400, 550))
    assert resumed["v"].to_pylist() == whole["v"].to_pylist()[400:]
    # JSON lines: fractions in the first chunk's first rows, whole numbers after; a
    # later piece that widens a field (its own fractions) before where a read resumes.
    monkeypatch.setattr(formats.base, "CHUNK_BYTES", 64)
    p = tmp_path / "b.jsonl"
    p.write_text('{"a":1}' + " " * 56 + '\n{"a":1.5,"b":1.5}\n{"a":2,"b":2}\n')
    whole, _, _ = read_all(p, "jsonl")
    resumed, numbers, _ = read_all(p, "jsonl", start=2)
    assert numbers == [2] and resumed.to_pylist() == whole.slice(2).to_pylist()
    assert resumed.schema.field("b").type == whole.schema.field("b").type == pa.float64()
    monkeypatch.setattr(formats.base, "CHUNK_BYTES", 8 * 1024 * 1024)
    p = tmp_path / "a.jsonl"
    p.write_text("".join(json.dumps({"v": i + (0.5 if i < 3 else 0)}) + "\n" for i in range(550)))
    for start in (2, 400):
        resumed, numbers, _ = read_all(p, "jsonl", start=start)
        assert resumed.schema.field("v").type == pa.float64()
        assert numbers == list(range(start, 550))
    chunks = list(read_chunks(LOCAL, str(p), "jsonl", 2))
    assert chunks[0].nbytes == p.stat().st_size  # progress counts a resumed piece too


def test_columns_parquet_cannot_hold_are_decoded_or_refused_by_name(tmp_path: Path) -> None:
    """A run-end encoded column is decoded (the same values); an interval would make the
    decoded lane's writer fail on every retry, so the file is refused, naming it."""
    import pyarrow.compute as pc

    p = tmp_path / "ree.arrow"
    t = pa.table({"id": [1, 2, 3], "s": pc.run_end_encode(pa.array(["x", "x", "y"]))})
    with pa.ipc.new_file(str(p), t.schema) as w:
        w.write_table(t)
    table, _, _ = read_all(p, "arrow")
    assert table.schema.field("s").type == pa.string()
    assert table["s"].to_pylist() == ["x", "x", "y"]
    p = tmp_path / "interval.arrow"
    iv = pa.array([pa.MonthDayNano([1, 2, 3])], pa.month_day_nano_interval())
    t = pa.table({"id": [1], "iv": iv})
    with pa.ipc.new_file(str(p), t.schema) as w:
        w.write_table(t)
    with pytest.raises(FileReadError, match=r"column iv \(month_day_nano_interval\)"):
        read_all(p, "arrow")


@pytest.mark.parametrize("header", [True, False])
def test_a_byte_order_mark_marks_the_file_and_is_data_inside_it(
    tmp_path: Path, header: bool
) -> None:
    """pyarrow drops a BOM that starts its input: the file's own, before a quoted first
    record, is dropped; one inside the file (files joined with cat) stays data wherever
    the pieces are cut (the cut property test draws BOMs too)."""
    p = tmp_path / "a.csv"
    p.write_bytes(b'\xef\xbb\xbf"a\nb",c\n3,4\n\xef\xbb\xbfx,5\n')
    chunks = list(read_chunks(LOCAL, str(p), "csv", 0, CsvOptions(header=header)))
    rows = [r for c in chunks for r in c.table.to_pylist()]
    assert not [b for c in chunks for b in c.broken]
    if header:
        assert rows == [{"a\nb": "3", "c": 4}, {"a\nb": "\ufeffx", "c": 5}]
    else:
        assert rows == [
            {"f0": "a\nb", "f1": "c"},
            {"f0": "3", "f1": "4"},
            {"f0": "\ufeffx", "f1": "5"},
        ]


def test_lane_ready_refuses_a_type_that_fails_only_with_values() -> None:
    from thalweg.sources.files.lane_ready import UnstorableColumnsError, lane_ready

    inner = pa.array([{"x": 1}, {"x": 2}])
    col = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), inner)
    with pytest.raises(UnstorableColumnsError, match="column d "):
        lane_ready(pa.table({"id": [1, 2, 3], "d": col}), set())


@pytest.mark.parametrize(
    ("text", "expected"),
    [("\n", []), ("  \n", []), ('{"a":null}\n  ', [{"a": None}]), ("{}\n  ", [{}])],
)
def test_json_lines_with_blank_pieces_and_no_fields_yet(
    tmp_path: Path, text: str, expected: list[dict[str, object]]
) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text(text)
    chunks = list(read_chunks(LOCAL, str(p), "jsonl"))
    assert [r for c in chunks for r in c.table.to_pylist()] == expected


def test_a_broken_csv_row_is_located_and_kept_whole(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_bytes(b'id,v\r\n1,a\r\n2,"b\r\nc",x\r\n\r\n3,"d"\r\n4\r\n')
    table, numbers, broken = read_all(p, "csv")
    assert table.to_pydict() == {"id": [1, 3], "v": ["a", "d"]}
    assert numbers == [0, 2]
    assert [(b.row, b.text) for b in broken] == [(1, b'2,"b\r\nc",x'), (3, b"4")]
    assert broken[0].message == "expected 2 columns, got 3"


def test_a_csv_value_its_column_cannot_take_fails_that_row_only(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    body = "n\n" + "".join(f"{i}\n" for i in range(5)) + "oops\n" + "7\n"
    p.write_text(body)
    chunks = list(read_chunks(LOCAL, str(p), "csv"))
    # One chunk: the parser infers from it (a string column); forced to int64 by a first
    # chunk, the value fails alone.
    assert sum(c.num_rows for c in chunks) == 7
    from thalweg.sources.files import formats

    recs = formats.records.split_records(body.encode(), ord('"'), True)
    recs.starts, recs.ends = recs.starts[1:], recs.ends[1:]
    chunk = formats.csv._parse_csv(recs, 0, ["n"], {"n": pa.int64()}, formats.CsvOptions(), 0)
    assert chunk.table["n"].to_pylist() == [0, 1, 2, 3, 4, 7]
    assert [(b.row, b.text) for b in chunk.broken] == [(5, b"oops")]
    assert "int64" in chunk.broken[0].message


def read_with(
    path: Path, opts: CsvOptions, fmt: str = "csv"
) -> tuple[pa.Table, list[int], list[BrokenRow]]:
    chunks = list(read_chunks(LOCAL, str(path), fmt, 0, opts))
    table = pa.concat_tables([c.table for c in chunks])
    return table, [int(r) for c in chunks for r in c.rows], [b for c in chunks for b in c.broken]


def test_another_quote_character_quotes_delimiters_line_breaks_and_itself(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_bytes(b"id;'the v'\n1;'a;b'\n2;'it''s'\n3;'two\nlines'\n4;'x';y\n5;\"\n")
    table, numbers, broken = read_with(p, CsvOptions(";", True, "'"))
    assert table.column_names == ["id", "the v"]
    assert table["the v"].to_pylist() == ["a;b", "it's", "two\nlines", '"']
    assert numbers == [0, 1, 2, 4]
    assert [(b.row, b.text, b.message) for b in broken] == [
        (3, b"4;'x';y", "expected 2 columns, got 3")
    ]


def test_without_quoting_a_quote_is_an_ordinary_character(tmp_path: Path) -> None:
    """A stray quote (inches, a half-open quote) neither joins lines nor fails a row."""
    p = tmp_path / "a.csv"
    p.write_bytes(b'size,la"bel\n5,5" pipe\n6,"half\n7,x\n8,"a,b"\n')
    table, numbers, broken = read_with(p, CsvOptions(quote=""))
    assert table.column_names == ["size", 'la"bel']
    assert table['la"bel'].to_pylist() == ['5" pipe', '"half', "x"]
    assert numbers == [0, 1, 2]
    assert [(b.row, b.text, b.message) for b in broken] == [
        (3, b'8,"a,b"', "expected 2 columns, got 3")
    ]
    # A line of spaces is a row, first line or not (JSON lines count it blank).
    p.write_bytes(b' \nx"\n  \n')
    table, numbers, broken = read_with(p, CsvOptions(header=False, quote=""))
    assert table["f0"].to_pylist() == [" ", 'x"', "  "] and numbers == [0, 1, 2]


def test_null_values_are_exactly_the_cells_named_in_every_column(tmp_path: Path) -> None:
    body = "n\ts\n1\t-\n-\tx\n\t\n2\tNULL\n"
    p = tmp_path / "a.tsv"
    p.write_text(body)
    table, numbers, _ = read_with(p, CsvOptions(null_values=("", "-")), "tsv")
    assert table.to_pydict() == {"n": [1, None, None, 2], "s": [None, "x", None, "NULL"]}
    # Unset, pyarrow's list: typed columns take "" and NULL as null, strings keep text;
    # "-" is no null, so the integer column is read as text.
    table, numbers, _ = read_with(p, CsvOptions(), "tsv")
    assert table.to_pydict() == {"n": ["1", "-", "", "2"], "s": ["-", "x", "", "NULL"]}
    p.write_text("n\tm\n1\t\n\tNULL\n")
    table, numbers, _ = read_with(p, CsvOptions(), "tsv")
    assert table.to_pydict() == {"n": [1, None], "m": [None, None]}
    # Named, a cell outside the list is a value: an empty cell makes a column text.
    p.write_text("n\tm\n1\ta\n-\tb\n\tc\n\n2\td\n")  # the blank line is no row
    table, numbers, broken = read_with(p, CsvOptions(null_values=("-",)), "tsv")
    assert table["n"].to_pylist() == ["1", None, "", "2"] and numbers == [0, 1, 2, 3]
    assert broken == []


def test_json_lines_widen_a_field_and_keep_broken_lines(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n   \n{"a": 2.5, "b": "x"}\n[1, 2]\n{"a":\n{"a": 3}\n')
    table, numbers, broken = read_all(p, "jsonl")
    assert table.to_pydict() == {"a": [1.0, 2.5, 3.0], "b": [None, "x", None]}
    assert numbers == [0, 1, 4]
    assert [(b.row, b.text) for b in broken] == [(2, b"[1, 2]"), (3, b'{"a":')]


@pytest.mark.parametrize("start", [0, 1, 39_999, 40_000, 99_999, 100_000])
def test_parquet_resumes_at_any_row(tmp_path: Path, start: int) -> None:
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"n": np.arange(100_000)}), p, row_group_size=40_000)
    table, numbers, _ = read_all(p, "parquet", start)
    assert numbers == list(range(start, 100_000))
    assert (table["n"].to_pylist() if table.num_columns else []) == numbers


@pytest.mark.parametrize("stream", [False, True])
def test_arrow_ipc_files_and_streams_resume(tmp_path: Path, stream: bool) -> None:
    p = tmp_path / "a.arrow"
    t = pa.table({"n": np.arange(1000)})
    opener = pa.ipc.new_stream if stream else pa.ipc.new_file
    with opener(str(p), t.schema) as w:
        for b in t.to_batches(max_chunksize=300):
            w.write_batch(b)
    table, numbers, _ = read_all(p, "arrow", 450)
    assert numbers == table["n"].to_pylist() == list(range(450, 1000))


def test_a_truncated_parquet_file_cannot_be_read(tmp_path: Path) -> None:
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"n": np.arange(10)}), p)
    p.write_bytes(p.read_bytes()[:-20])
    with pytest.raises(FileReadError, match=r"a\.parquet"):
        read_all(p, "parquet")


def test_empty_files_have_no_rows(tmp_path: Path) -> None:
    for name, fmt in [("a.csv", "csv"), ("a.jsonl", "jsonl")]:
        (tmp_path / name).write_bytes(b"")
        assert read_all(tmp_path / name, fmt)[1] == []
    (tmp_path / "h.csv").write_text("a,b\n")
    assert read_all(tmp_path / "h.csv", "csv")[1] == []


def batch(table: pa.Table, rows: list[int], broken: list[BrokenRow]) -> pa.RecordBatch:
    return file_rows_batch(
        table=table,
        rows=np.array(rows, dtype=np.int64),
        broken=broken,
        topic="t",
        partition=3,
        uri="file:///x.csv",
        mtime_ms=1_000,
        cluster="files",
        ingest_ts_us=2_000,
        columns=C,
    )


def test_file_rows_interleave_broken_rows_by_number() -> None:
    raw = batch(
        pa.table({"a": [10, 30]}),
        [0, 2],
        [BrokenRow(1, b"bad", "expected 1 columns, got 2"), BrokenRow(3, b"x", "nope")],
    )
    assert raw.column(C.position).to_pylist() == [0, 1, 2, 3]
    assert raw.column(C.value).to_pylist() == [None, b"bad", None, b"x"]
    assert set(raw.column(C.source("message_id")).to_pylist()) == {b"file:///x.csv"}
    assert strip_payload(raw, C).schema == C.raw_schema
    decoder = ArrowRowDecoder(C)
    decoded, result = decode_batch(decoder, raw, C)
    assert decoded["a"].to_pylist() == [10, None, 30, None]
    assert [(f.row, f.reason) for f in result.failures] == [
        (1, DecodeReason.SYNTAX),
        (3, DecodeReason.SYNTAX),
    ]
    assert decoded[C.decode_error].to_pylist()[1] == "syntax: expected 1 columns, got 2"


def test_the_row_decoder_refuses_what_other_decoders_refuse() -> None:
    decoder = ArrowRowDecoder(C, pa.schema([pa.field("a", pa.int64())]))
    _, result = decode_batch(decoder, batch(pa.table({"a": ["x", "y"]}), [0, 1], []), C)
    assert {f.reason for f in result.failures} == {DecodeReason.SCHEMA_CONFLICT}
    _, result = decode_batch(decoder, batch(pa.table({"_twg_a": [1]}), [0], []), C)
    assert {f.reason for f in result.failures} == {DecodeReason.RESERVED_FIELD}
    _, result = decode_batch(decoder, batch(pa.table({"b": [1.5]}), [0], []), C)
    assert not result.failures and decoder.schema.names == ["a", "b"]
    # Bytes from a broker are not file rows.
    r = decoder.decode(pa.array([b"{}", None], pa.binary()))
    assert [(f.row, f.reason) for f in r.failures] == [(0, DecodeReason.UNSUPPORTED)]


def test_dead_typed_rows_keep_their_fields_as_json() -> None:
    raw = batch(
        pa.table({"a": [1], "b": [b"\x00\xff"], "t": pa.array([0], pa.timestamp("s"))}),
        [0],
        [BrokenRow(1, b"raw text", "bad")],
    )
    dead = row_bytes(pa.Table.from_batches([raw]), C)
    values = dead.column(C.value).to_pylist()
    assert json.loads(values[0]) == {"a": 1, "b": "AP8=", "t": "1970-01-01T00:00:00"}
    assert values[1] == b"raw text"


@pytest.mark.parametrize("start", [0, 70_000, 150_001])
def test_the_careful_csv_reader_takes_over_where_the_fast_one_stopped(
    tmp_path: Path, start: int
) -> None:
    """pyarrow's streaming reader hands on whole chunks until a row does not parse; the
    careful reader then goes on from the first row not handed on: none lost or twice."""
    p = tmp_path / "a.csv"
    lines = ["n,s"] + [f"{i},x{i}" for i in range(150_000)] + ["150000,a,b"]
    lines += [f"{i},x{i}" for i in range(150_001, 150_010)]
    p.write_text("\n".join(lines) + "\n")
    table, numbers, broken = read_all(p, "csv", start)
    assert numbers == [i for i in range(start, 150_010) if i != 150_000]
    assert table["n"].to_pylist() == numbers
    assert [b.row for b in broken] == ([150_000] if start <= 150_000 else [])


def test_bad_values_in_a_later_piece_fail_alone(tmp_path: Path) -> None:
    """The first piece's types hold for the file; a later piece with values they cannot
    take is bisected down to those rows."""
    p = tmp_path / "big.csv"
    pad = "x" * 40
    bad = {300_000, 300_001, 350_123}
    with open(p, "w") as f:
        f.write("n,pad\n")
        for i in range(400_000):
            f.write(f"{'oops' if i in bad else i},{pad}\n")
    chunks = list(read_chunks(LOCAL, str(p), "csv"))
    assert len(chunks) > 2
    numbers = [int(r) for c in chunks for r in c.rows]
    assert numbers == [i for i in range(400_000) if i not in bad]
    assert sorted(b.row for c in chunks for b in c.broken) == sorted(bad)
    values = [v for c in chunks for v in c.table["n"].to_pylist()]
    assert values == numbers


async def test_a_file_source_reads_again_from_where_it_is_sought(tmp_path: Path) -> None:
    from thalweg.config.models import FilesSourceConfig
    from thalweg.group.owners import OwnerDirectory
    from thalweg.sources.files.source import FileSource

    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"n": np.arange(3_000)}), p, row_group_size=1_000)
    cfg = FilesSourceConfig(
        kind="files", name="f", topics=["t"], paths=[str(p)], state_dir=tmp_path / "state"
    )
    source = FileSource(cfg, C, OwnerDirectory())
    assigned: list[object] = []

    async def on_assigned(keys: list[tuple[str, int]]) -> None:
        assigned.extend(keys)

    await source.start(on_assigned, on_assigned)
    assert assigned == [("t", 0)]
    first = await source.fetch(100, 1_000)
    assert first[("t", 0)].column(C.position).to_pylist() == list(range(1_000))
    source.seek(("t", 0), 500)  # e.g. a batch lost before it was durable
    again = await source.fetch(100, 1_000)
    assert again[("t", 0)].column(C.position).to_pylist()[:3] == [500, 501, 502]
    await source.stop()


async def test_a_new_files_rows_wait_for_its_hash_in_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New files are hashed beside the reading, but no row is handed on (so none can be
    durable) before the manifest on disk holds its file's hash; a file whose hash
    cannot be read is failed with its reason; an empty file is hashed at the end; an
    entry never hashed is dropped when the manifest is loaded again."""
    import hashlib
    import threading

    from thalweg.config.models import FilesSourceConfig
    from thalweg.group.owners import OwnerDirectory
    from thalweg.sources.files import source as source_mod
    from thalweg.sources.files.manifest import Manifest

    paths = [tmp_path / f"{i}.parquet" for i in range(3)]
    for i, p in enumerate(paths):
        pq.write_table(pa.table({"n": np.arange(i * 10, i * 10 + 5)}), p)
    (tmp_path / "3.csv").write_text("")  # empty: no row ever waits for its hash
    pq.write_table(pa.table({"n": [1]}), tmp_path / "4.parquet")  # its hash fails (below)
    release = threading.Event()
    real = source_mod.content_hash

    def slow_hash(fs: pafs.FileSystem, path: str) -> str:
        if path.endswith("4.parquet"):
            raise FileNotFoundError(path)
        release.wait(10)
        return real(fs, path)

    monkeypatch.setattr(source_mod, "content_hash", slow_hash)
    state = tmp_path / "state"
    cfg = FilesSourceConfig(
        kind="files", name="f", topics=["t"], paths=[str(tmp_path)], state_dir=state
    )
    source = source_mod.FileSource(cfg, C, OwnerDirectory())

    async def on_assigned(keys: list[tuple[str, int]]) -> None:
        del keys

    await source.start(on_assigned, on_assigned)
    on_disk = json.loads((state / "manifest.json").read_text())["files"]
    assert [e["sha256"] for e in on_disk] == [""] * 5  # admitted at once, none hashed yet
    fetching = asyncio.ensure_future(source.fetch(100, 1_000))
    await asyncio.sleep(0.3)
    assert not fetching.done()  # the rows are read; they wait for the hash
    release.set()
    first = await fetching
    on_disk = json.loads((state / "manifest.json").read_text())["files"]
    assert on_disk[0]["sha256"] == hashlib.sha256(paths[0].read_bytes()).hexdigest()
    assert first[("t", 0)].column(C.position).to_pylist() == [0, 1, 2, 3, 4]
    got = [first]
    while len(got) < 10 and not source.finished.is_set():
        got.append(await source.fetch(50, 1_000))
    await source.settle()
    await source.stop()
    entries = {Path(e.uri).name: e for e in source.manifest.entries}
    for name in ("0.parquet", "1.parquet", "2.parquet", "3.csv"):
        want = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
        assert entries[name].sha256 == want, name
    assert entries["4.parquet"].state == "failed"
    assert "cannot be read" in (entries["4.parquet"].error or "")
    assert entries["3.csv"].state == "done"
    rows = [r for g in got for b in g.values() for r in b.column(C.position).to_pylist()]
    assert sorted(rows) == sorted([0, 1, 2, 3, 4] * 3)
    assert source.progress.files_failed == 1

    # A manifest saved while a hash was still being computed: that entry had no row
    # handed on, so it is dropped (its file is new again to the next run).
    body = json.loads((state / "manifest.json").read_text())
    body["files"].append({**body["files"][0], "partition": 9, "sha256": "", "committed": 0})
    (state / "manifest.json").write_text(json.dumps(body))
    assert 9 not in {e.partition for e in Manifest.load(state, "t").entries}


async def ten_rows_source(tmp_path: Path) -> tuple[FileSource, Path]:
    """A started file source of one new ten-row Parquet file; its state directory."""
    from thalweg.config.models import FilesSourceConfig
    from thalweg.group.owners import OwnerDirectory

    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"n": np.arange(10)}), p)
    state = tmp_path / "state"
    cfg = FilesSourceConfig(kind="files", name="f", topics=["t"], paths=[str(p)], state_dir=state)
    source = FileSource(cfg, C, OwnerDirectory())

    async def on_assigned(keys: list[tuple[str, int]]) -> None:
        del keys

    await source.start(on_assigned, on_assigned)
    return source, state


async def test_a_manifest_the_disk_cannot_take_is_a_retriable_commit_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk at a commit: the source says so as a broker's refused commit (the
    next segment's commit covers it), the manifest on disk stays as it was, and no temp
    file is left beside it."""
    from thalweg.errors import SourceError

    source, state = await ten_rows_source(tmp_path)
    await source.fetch(100, 1_000)  # its hash is saved before its rows are handed on
    before = (state / "manifest.json").read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(SourceError, match="No space left on device"):
        await source.commit({("t", 0): 10})
    monkeypatch.undo()
    assert (state / "manifest.json").read_bytes() == before
    assert [f.name for f in state.iterdir() if ".tmp" in f.name] == []
    await source.commit({("t", 0): 10})  # space again: the next commit saves it
    assert json.loads((state / "manifest.json").read_text())["files"][0]["committed"] == 10
    await source.stop()


async def test_a_new_files_rows_wait_while_the_disk_refuses_its_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk when a new file's hash is to be saved: no row of it is handed on
    (nothing of it may be durable while the manifest lacks its identity), and the run
    waits rather than fails; once space is freed, the rows come, the hash saved."""
    source, state = await ten_rows_source(tmp_path)
    refused = 0

    def full(fd: int) -> None:
        nonlocal refused
        refused += 1
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    fetch = asyncio.create_task(source.fetch(100, 1_000))
    while refused < 3:
        await asyncio.sleep(0.05)
    assert not fetch.done()  # waiting, neither failed nor handing rows on
    monkeypatch.undo()
    got = await asyncio.wait_for(fetch, 30)
    assert sum(b.num_rows for b in got.values()) == 10
    saved = json.loads((state / "manifest.json").read_text())["files"][0]
    assert saved["sha256"] not in ("", None)
    assert [f.name for f in state.iterdir() if ".tmp" in f.name] == []
    await source.stop()


@pytest.mark.parametrize("start", [0, 70_000])
def test_avro_files_read_natively_equal_the_per_record_read(tmp_path: Path, start: int) -> None:
    import fastavro

    from thalweg.sources.files.formats.avro import _avro_per_record

    schema = {
        "type": "record",
        "name": "r",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "tag", "type": ["null", "string"]},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
    p = tmp_path / "a.avro"
    records = [{"id": i, "tag": None if i % 3 else f"t{i}", "at": i} for i in range(100_000)]
    with open(p, "wb") as f:
        fastavro.writer(f, schema, records, codec="deflate")
    from thalweg.codecs.avro import container_batches

    assert sum(t.num_rows for t in container_batches(str(p), schema)) == 100_000  # native
    native, numbers, _ = read_all(p, "avro", start)
    slow = pa.concat_tables([c.table for c in _avro_per_record(LOCAL, str(p), start)])
    assert numbers == list(range(start, 100_000))
    assert native.equals(slow)


def test_the_run_that_takes_the_lock_removes_a_killed_runs_half_manifest(tmp_path: Path) -> None:
    from thalweg.sources.files.manifest import MANIFEST_NAME, Manifest

    state = tmp_path / "state"
    state.mkdir()
    half = state / (MANIFEST_NAME + ".tmp-4610")  # kill -9 between write and rename
    half.write_text('{"version"')
    fd = Manifest.lock(state, "t")
    try:
        assert not half.exists()
        assert Manifest.load(state, "t").entries == []
    finally:
        os.close(fd)
