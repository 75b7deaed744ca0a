"""The decode stage decodes a fetch's partitions of one topic in one decoder call; each
partition gets exactly the rows, errors and failures it would have got alone."""

from __future__ import annotations

import json
from collections import namedtuple

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from thalweg.codecs.json import JsonArrowDecoder
from thalweg.pipeline.decode import decode_batch, decode_batches
from thalweg.records import MetadataColumns, build_raw_batch

COLS = MetadataColumns()
R = namedtuple("R", "topic partition offset timestamp timestamp_type key value headers")

payloads = st.one_of(
    st.none(),  # a tombstone
    st.just(b""),
    st.just(b"{broken"),
    st.just(b"[1, 2]"),
    st.builds(
        lambda i, name, extra: json.dumps(
            {"id": i, "name": name, **({"extra": extra} if extra is not None else {})}
        ).encode(),
        st.one_of(st.integers(-5, 5), st.just("five")),
        st.text(max_size=4),
        st.one_of(st.none(), st.booleans()),
    ),
)


def _raw(partition: int, values: list[bytes | None]) -> pa.RecordBatch:
    recs = [R("t", partition, o, 0, 0, None, v, ()) for o, v in enumerate(values)]
    return build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=COLS)


def _rows(table: pa.Table) -> list[dict[str, object]]:
    """Rows without their null fields (a batch decoded alone knows fewer fields) and
    with the error's reason, not its text (the parser words a conflict its own way)."""
    error = COLS.decode_error
    return [
        {k: (v.split(":")[0] if k == error else v) for k, v in r.items() if v is not None}
        for r in table.to_pylist()
    ]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(payloads, min_size=1, max_size=12), min_size=1, max_size=5))
def test_one_call_for_many_partitions_equals_a_call_each(
    partitions: list[list[bytes | None]],
) -> None:
    raws = [_raw(p, values) for p, values in enumerate(partitions)]
    joined = decode_batches(JsonArrowDecoder(COLS), raws, COLS)
    alone = JsonArrowDecoder(COLS)
    for raw, got in zip(raws, joined, strict=True):
        want_table, want = decode_batch(alone, raw, COLS)
        assert got.table.num_rows == raw.num_rows
        assert _rows(got.table) == _rows(want_table)
        assert [(f.row, f.reason) for f in got.failures] == [
            (f.row, f.reason) for f in want.failures
        ]
        positions = got.table.column(COLS.position).to_pylist()
        assert positions == raw.column(COLS.position).to_pylist()
    # The shares of the decoded bytes add up to what the one decode holds, about.
    assert sum(g.nbytes for g in joined) > 0
