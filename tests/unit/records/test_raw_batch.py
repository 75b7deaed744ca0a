"""Raw-lane batches: edge values, header fidelity, record ids, Parquet/IPC round trips."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import ipc

from thalweg.records import MetadataColumns, build_raw_batch
from thalweg.records.record_id import record_ids

COLS = MetadataColumns()


@dataclass(frozen=True)
class Rec:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str | bytes, bytes | None]] = field(default_factory=tuple)
    timestamp: int = 0
    timestamp_type: int = 0
    topic: str = "t"
    partition: int = 3


def batch(recs: list[Rec]) -> pa.RecordBatch:
    return build_raw_batch(recs, cluster="c", ingest_ts_us=42, columns=COLS)


def test_nulls_and_empties_stay_distinct() -> None:
    b = batch([Rec(0, None, b""), Rec(1, b"", None), Rec(2, None, None), Rec(3, b"", b"")])
    assert b.column(COLS.source("key")).to_pylist() == [None, b"", None, b""]
    assert b.column(COLS.value).to_pylist() == [b"", None, None, b""]
    assert b.schema == COLS.raw_schema


def test_headers_keep_order_duplicates_and_nulls() -> None:
    h = (("a", b"1"), ("a", None), (b"\xff\xfe", b""), ("a", b"3"))
    b = batch([Rec(0, b"k", b"v", h), Rec(1, b"k", b"v", ())])
    got = b.column(COLS.source("headers")).to_pylist()
    assert got[0] == [
        {"key": b"a", "value": b"1"},
        {"key": b"a", "value": None},
        {"key": b"\xff\xfe", "value": b""},
        {"key": b"a", "value": b"3"},
    ]
    assert got[1] == []


def test_timestamps_and_types() -> None:
    b = batch(
        [
            Rec(0, None, b"", timestamp=-5, timestamp_type=0),
            Rec(1, None, b"", timestamp=7, timestamp_type=1),
        ]
    )
    assert b.column(COLS.timestamp).cast(pa.int64()).to_pylist() == [-5, 7]
    assert b.column(COLS.source("timestamp_type")).to_pylist() == ["CreateTime", "LogAppendTime"]


def test_transport_only_columns_are_null_for_kafka() -> None:
    b = batch([Rec(0, b"k", b"v")])
    for name in ("message_id", "ledger_id", "publish_time", "event_time", "redelivery_count"):
        assert b.column(COLS.source(name)).null_count == 1


def test_record_ids_are_deterministic_unique_and_ordered() -> None:
    import numpy as np

    a = record_ids("c", "t", 0, np.arange(5, dtype=np.int64)).to_pylist()
    again = record_ids("c", "t", 0, np.arange(5, dtype=np.int64)).to_pylist()
    other = record_ids("c", "t", 1, np.arange(5, dtype=np.int64)).to_pylist()
    other_cluster = record_ids("d", "t", 0, np.arange(5, dtype=np.int64)).to_pylist()
    assert a == again and a == sorted(a) and len(set(a)) == 5
    assert not set(a) & set(other) and not set(a) & set(other_cluster)


def test_prefix_is_configurable_and_validated() -> None:
    cols = MetadataColumns("meta_")
    assert cols.offset == "meta_source_offset" and cols.record_id == "meta_record_id"
    for bad in ("", "1x", "a-b", "x" * 40):
        try:
            MetadataColumns(bad)
        except ValueError:
            continue
        raise AssertionError(f"prefix {bad!r} accepted")


header = st.tuples(
    st.one_of(st.text(max_size=8), st.binary(max_size=8)), st.none() | st.binary(max_size=8)
)
record = st.tuples(
    st.none() | st.binary(max_size=32),
    st.none() | st.binary(max_size=64),
    st.lists(header, max_size=6),
    st.integers(min_value=-(2**40), max_value=2**42),
    st.sampled_from([0, 1]),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(record, min_size=1, max_size=40))
def test_arbitrary_records_round_trip_parquet_and_ipc(rows: list[tuple]) -> None:  # type: ignore[type-arg]
    recs = [Rec(i, k, v, h, ts, tt) for i, (k, v, h, ts, tt) in enumerate(rows)]
    b = batch(recs)
    table = pa.Table.from_batches([b])
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    assert pq.read_table(io.BytesIO(buf.getvalue())).equals(table)
    sink = io.BytesIO()
    with ipc.new_stream(sink, b.schema) as w:
        w.write_batch(b)
    assert ipc.open_stream(sink.getvalue()).read_all().equals(table)
    # And the batch holds exactly what went in.
    keys = [k.encode() if isinstance(k, str) else k for _, _, h, _, _ in rows for k, _ in h]
    flat = [e["key"] for hs in b.column(COLS.source("headers")).to_pylist() for e in hs]
    assert flat == keys
    assert b.column(COLS.source("key")).to_pylist() == [r[0] for r in rows]
    assert b.column(COLS.value).to_pylist() == [r[1] for r in rows]


def test_empty_batch_has_the_schema_and_accumulators_ignore_it() -> None:
    from thalweg.engine.ingest.accumulate import Accumulator

    empty = batch([])
    assert empty.num_rows == 0 and empty.schema == COLS.raw_schema
    acc = Accumulator(COLS, 5)
    acc.add(empty)
    assert acc.empty


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.integers(0, 40),
            st.lists(
                st.tuples(
                    st.one_of(st.none(), st.binary(max_size=8)),
                    st.one_of(st.none(), st.binary(max_size=20)),
                    st.lists(
                        st.tuples(st.text(max_size=3), st.none() | st.binary(max_size=4)),
                        max_size=2,
                    ),
                    st.sampled_from([0, 1]),
                ),
                min_size=1,
                max_size=6,
            ),
        ),
        min_size=1,
        max_size=6,
        unique_by=lambda p: (p[0], p[1]),
    ),
    st.booleans(),
)
def test_a_fetch_s_batches_built_together_equal_each_built_alone(
    parts: list[
        tuple[
            str, int, list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]
        ]
    ],
    big: bool,
) -> None:
    """Many small partitions of a fetch share one built batch (sliced); each slice holds
    exactly what that partition's batch built alone holds."""
    import numpy as np

    from thalweg.records import raw_batch
    from thalweg.records.raw_batch import PartitionColumns, build_headers, raw_batch_from_columns

    cols = []
    for topic, partition, recs in parts:
        n = len(recs)
        cols.append(
            PartitionColumns(
                topic,
                partition,
                np.arange(100, 100 + n, dtype=np.int64),
                np.arange(n, dtype=np.int64) * 7,
                np.array([r[3] for r in recs], np.int8),
                pa.array([r[0] for r in recs], pa.binary()),
                pa.array([r[1] for r in recs], pa.binary()),
                build_headers([r[2] for r in recs]),
            )
        )
    joint_rows = raw_batch.JOINT_ROWS
    try:
        if big:  # every partition large: each built on its own
            raw_batch.JOINT_ROWS = 1
        got = raw_batch.raw_batches_from_columns(cols, cluster="c", ingest_ts_us=9, columns=COLS)
    finally:
        raw_batch.JOINT_ROWS = joint_rows
    for p, b in zip(cols, got, strict=True):
        alone = raw_batch_from_columns(**p._asdict(), cluster="c", ingest_ts_us=9, columns=COLS)
        assert b.to_pylist() == alone.to_pylist()
        assert b.schema == alone.schema
