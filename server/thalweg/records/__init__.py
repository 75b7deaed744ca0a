"""The record model: metadata columns, raw-lane batch building, record ids.

Pure data code: imports pyarrow and numpy, never a broker client, a socket or asyncio.
"""

from __future__ import annotations

from thalweg.records.columns import (
    DEFAULT_PREFIX,
    MetadataColumns,
    MetadataPolicy,
)
from thalweg.records.raw_batch import KafkaLikeRecord, build_raw_batch
from thalweg.records.record_id import record_ids

__all__ = [
    "DEFAULT_PREFIX",
    "KafkaLikeRecord",
    "MetadataColumns",
    "MetadataPolicy",
    "build_raw_batch",
    "record_ids",
]
