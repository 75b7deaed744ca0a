"""The on-disk lanes: raw (primary, gates commits) and decoded, as Hive-style Parquet.

Layout under ``data_dir``::

    raw/_thalweg.json                                   format version + metadata prefix
    raw/topic=<topic>/partition=<p>/<first>-<last>.parquet
    decoded/topic=<topic>/partition=<p>/<first>-<last>.parquet   same rows, same order

``first`` and ``last`` are the first and last offsets in the file, 20 digits, so names
sort by offset and a replay after a crash rewrites the same name instead of a duplicate.
"""

from __future__ import annotations

from thalweg.lane.coverage import Coverage, resume_position, scan_coverage
from thalweg.lane.layout import Lane, LaneLayout, Segment
from thalweg.lane.writer import SegmentWriter

__all__ = [
    "Coverage",
    "Lane",
    "LaneLayout",
    "Segment",
    "SegmentWriter",
    "resume_position",
    "scan_coverage",
]
