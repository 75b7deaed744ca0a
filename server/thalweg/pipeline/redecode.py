"""Repair of the decoded lane: rebuild decoded segments from their raw twins.

A decoded-lane write that failed never blocks the raw lane (the primary); the raw
segment is durable and committed without its decoded twin, which is rebuilt here while
the gateway runs (``engine/ingest/rebuilds.py``) and when the partition is next assigned — the
raw segment itself is never written again.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from thalweg.codecs.base import ArrowDecoder
from thalweg.lane.layout import Segment
from thalweg.lane.writer import SegmentWriter
from thalweg.pipeline.decode import decode_batch
from thalweg.records.columns import MetadataColumns


def redecode(
    writer: SegmentWriter,
    decoder: ArrowDecoder,
    columns: MetadataColumns,
    topic: str,
    partition: int,
    segments: list[Segment],
) -> None:
    """Decode each raw segment in ``segments`` again and write its decoded twin."""
    for seg in segments:
        raw = pq.read_table(seg.path).replace_schema_metadata(None)
        decoded = pa.concat_tables(
            [decode_batch(decoder, b, columns)[0] for b in raw.to_batches()],
            promote_options="permissive",
        )
        writer.write_decoded(topic, partition, seg, decoded)
