"""The buffer bound counts what a partition really holds: the raw batches and their
decoded copies, until the segment that holds them is written."""

from __future__ import annotations

import json
import math
from collections import namedtuple

import pyarrow as pa

from thalweg.codecs.json import JsonArrowDecoder
from thalweg.config.models import RawLaneConfig
from thalweg.engine.ingest.buffer import PartitionBuffer
from thalweg.pipeline.decode import decode_batch
from thalweg.records import MetadataColumns, build_raw_batch

COLS = MetadataColumns()
R = namedtuple("R", "topic partition offset timestamp timestamp_type key value headers")


def _raw(first: int, n: int) -> pa.RecordBatch:
    recs = [
        R("t", 0, o, 0, 0, None, json.dumps({"id": o, "name": "x" * 40}).encode(), ())
        for o in range(first, first + n)
    ]
    return build_raw_batch(recs, cluster="c", ingest_ts_us=1, columns=COLS)


def test_held_bytes_count_the_decoded_copies() -> None:
    decoded_buf = PartitionBuffer.create(
        "t", 0, durable=None, committed=None, columns=COLS, decoded=True
    )
    raw_buf = PartitionBuffer.create(
        "t", 0, durable=None, committed=None, columns=COLS, decoded=False
    )
    decoder = JsonArrowDecoder(COLS)
    for first in (0, 1000):
        batch = _raw(first, 1000)
        table, result = decode_batch(decoder, batch, COLS)
        decoded_buf.add(batch, table, result.failures)
        raw_buf.add(batch)
    decoded = decoded_buf.acc.decoded_bytes
    assert decoded > 0
    assert decoded_buf.held_bytes == raw_buf.held_bytes + decoded
    # Taken to be written: still held (in flight) until the write returns.
    pending = decoded_buf.take(RawLaneConfig(), math.inf)
    assert pending.nbytes == raw_buf.held_bytes + decoded
    assert decoded_buf.held_bytes == pending.nbytes
    assert decoded_buf.acc.decoded_bytes == 0
    assert pending.decoded is not None and pending.decoded.num_rows == 2000
