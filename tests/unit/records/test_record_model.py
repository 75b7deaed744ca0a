"""The record model and its three representations (raw, Arrow, Value) over one
accumulator."""

from __future__ import annotations

import dataclasses
import typing
from collections import namedtuple

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.corpus.edge_records import EDGES
from thalweg.codecs import JsonArrowDecoder
from thalweg.engine.ingest.accumulate import Accumulator
from thalweg.pipeline.decode import decode_batch
from thalweg.records import MetadataColumns, build_raw_batch
from thalweg.records.columns import SOURCE_COLUMNS, MetadataPolicy
from thalweg.records.convert import (
    SOURCE_FIELDS,
    batch_from_records,
    records_from_batch,
    values_from_tables,
)
from thalweg.records.model import RawRecord
from thalweg.records.record_id import record_ids

COLS = MetadataColumns()
K = namedtuple("K", "topic partition offset timestamp timestamp_type key value headers")


def leaf_paths(cls: type, prefix: str = "") -> set[str]:
    """Dotted paths of every non-dataclass field, e.g. ``locator.offset``."""
    hints = typing.get_type_hints(cls)
    out: set[str] = set()
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            out |= leaf_paths(t, f"{prefix}{f.name}.")
        else:
            out.add(prefix + f.name)
    return out


def test_every_record_field_has_a_column_and_a_corpus_entry() -> None:
    """Structural gate: adding a field to RawRecord without mapping it to a lane column
    (and so without the corpus exercising it) fails here."""
    assert set(SOURCE_FIELDS) == {s for s, _ in SOURCE_COLUMNS}
    assert set(SOURCE_FIELDS.values()) == leaf_paths(RawRecord)
    # Every Kafka-visible field is varied by the edge corpus.
    varied = {"key", "value", "headers", "timestamp.ms"}
    seen = set()
    for edge in EDGES:
        if edge.key in (None, b""):
            seen.add("key")
        if edge.value in (None, b""):
            seen.add("value")
        if edge.headers:
            seen.add("headers")
        if edge.timestamp_ms is not None:
            seen.add("timestamp.ms")
    assert varied <= seen


def kafka_batch(n: int = 5, start: int = 0) -> pa.RecordBatch:
    recs = [
        K(
            "t",
            1,
            start + i,
            1_000 + i,
            i % 2,
            None if i == 0 else b"k%d" % i,
            b'{"i": %d}' % i if i != 1 else None,
            (("h", b"1"), ("h", None)) if i == 2 else (),
        )
        for i in range(n)
    ]
    return build_raw_batch(recs, cluster="c", ingest_ts_us=7, columns=COLS)


def test_raw_batch_to_records_and_back_is_exact() -> None:
    batch = kafka_batch()
    records = records_from_batch(batch, COLS)
    assert records[0].key is None and records[1].value is None
    assert records[2].headers == ((b"h", b"1"), (b"h", None))
    assert records[1].timestamp.type == 1
    ids = record_ids("c", "t", 1, np.arange(5, dtype=np.int64))
    again = batch_from_records(records, COLS, record_ids=ids, ingest_ts_us=7)
    assert again.equals(batch)


header = st.tuples(st.binary(max_size=6), st.none() | st.binary(max_size=6))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.none() | st.binary(max_size=20),
            st.none() | st.binary(max_size=40),
            st.lists(header, max_size=5),
            st.integers(-(2**41), 2**41),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_arbitrary_records_round_trip(rows: list[tuple]) -> None:  # type: ignore[type-arg]
    recs = [K("t", 0, i, ts, 0, k, v, tuple(h)) for i, (k, v, h, ts) in enumerate(rows)]
    batch = build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=COLS)
    records = records_from_batch(batch, COLS)
    assert [(r.key, r.value, list(r.headers), r.timestamp.ms) for r in records] == [
        (k, v, h, ts) for k, v, h, ts in rows
    ]
    ids = batch.column(COLS.record_id)
    assert batch_from_records(records, COLS, record_ids=ids, ingest_ts_us=1).equals(batch)


def test_one_accumulator_gives_every_representation_and_one_span() -> None:
    """Raw, decoded and Value rows of the same records, with the span they cover
    (skipped offsets included) computed once."""
    decoder = JsonArrowDecoder(COLS)
    raw_only, both = Accumulator(COLS, 0), Accumulator(COLS, 0, decoded=True)
    for batch in (kafka_batch(5, 0), kafka_batch(3, 7)):  # offsets 5-6 skipped (markers)
        raw_only.add(batch)
        table, result = decode_batch(decoder, batch, COLS)
        both.add(batch, table, result.failures)
    a, b = raw_only.finish(), both.finish()
    assert a.span == b.span
    span = a.span
    assert (span.first, span.last, span.covers_from, span.covers_to, span.records) == (
        0,
        9,
        0,
        10,
        8,
    )
    assert a.decoded is None and a.raw.equals(b.raw)
    assert b.decoded is not None and b.raw.num_rows == b.decoded.num_rows == 8
    fields = [f.name for f in COLS.metadata_fields(MetadataPolicy.LOCATOR)]
    values = values_from_tables(b.raw, b.decoded, COLS, fields)
    assert values[0]["i"] == 0 and values[1]["i"] is None
    assert values[0]["_twg_"]["source_offset"] == 0 and values[7]["_twg_"]["source_offset"] == 9
    assert values[1]["_twg_"]["decode_error"] is None  # a tombstone is not an error
    # The next batch continues the span where the last one ended.
    raw_only.add(kafka_batch(2, 12))
    nxt = raw_only.finish().span
    assert (nxt.covers_from, nxt.covers_to) == (10, 14)


def test_a_decoded_accumulator_takes_only_decoded_batches() -> None:
    with pytest.raises(ValueError, match="decoded rows"):
        Accumulator(COLS, 0, decoded=True).add(kafka_batch(1, 0))


def test_finish_on_an_empty_accumulator_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        Accumulator(COLS).finish()
