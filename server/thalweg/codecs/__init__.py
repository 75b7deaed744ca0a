"""Payload decoders: bytes → Arrow, per batch. No transport, no server, no event loop.

Each decoder turns a ``binary`` array of payloads (one per raw-lane row) into a table with
exactly one row per payload plus a per-row error column, so decoded rows stay aligned with
the raw lane and a failure is attributable to its record.
"""

from __future__ import annotations

from thalweg.codecs.base import (
    ArrowDecoder,
    DecodeFailure,
    DecodeReason,
    DecodeResult,
    ValueDecoder,
)
from thalweg.codecs.json import JsonArrowDecoder

__all__ = [
    "ArrowDecoder",
    "DecodeFailure",
    "DecodeReason",
    "DecodeResult",
    "JsonArrowDecoder",
    "ValueDecoder",
]
