"""Sinks: where batches of records go.

``batch`` holds the three representations over one abstraction (raw, Arrow, Value, and a
tee of two); every one returns the same :class:`OffsetSpan`, so commit-after-write is
written once whatever a consumer keeps.
"""

from __future__ import annotations

from thalweg.sinks.batch import ArrowSink, BatchSink, OffsetSpan, RawSink, TeeSink, ValueSink
from thalweg.sinks.kafka import KafkaWriter, Written

__all__ = [
    "ArrowSink",
    "BatchSink",
    "KafkaWriter",
    "OffsetSpan",
    "RawSink",
    "TeeSink",
    "ValueSink",
    "Written",
]
