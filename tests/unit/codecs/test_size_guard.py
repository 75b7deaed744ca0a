"""Oversize payloads are refused before decoding, rows stay aligned."""

from __future__ import annotations

import json

import pyarrow as pa

from thalweg.codecs.base import DecodeReason
from thalweg.codecs.guard import SizeGuard
from thalweg.codecs.json import JsonArrowDecoder
from thalweg.records import MetadataColumns


def test_oversize_rows_fail_as_oversize_and_the_rest_decode() -> None:
    guard = SizeGuard(JsonArrowDecoder(MetadataColumns()), max_bytes=40)
    big = json.dumps({"i": 1, "pad": "x" * 100}).encode()
    values = pa.array([b'{"i": 0}', big, None, b'{"i": 3}', b"{bad"], pa.binary())
    result = guard.decode(values)
    assert result.table.num_rows == 5
    assert result.table.column("i").to_pylist() == [0, None, None, 3, None]
    reasons = {f.row: f.reason for f in result.failures}
    assert reasons == {1: DecodeReason.OVERSIZE, 4: DecodeReason.SYNTAX}
    errors = result.errors.to_pylist()
    assert errors[1] == f"oversize: payload of {len(big)} bytes exceeds max_record_bytes (40)"
    assert errors[0] is None
    assert errors[2] is None  # a tombstone is not oversize


def test_nothing_oversize_is_the_inner_decoder_untouched() -> None:
    inner = JsonArrowDecoder(MetadataColumns())
    guard = SizeGuard(inner, max_bytes=1 << 20)
    result = guard.decode(pa.array([b'{"a": 1}'], pa.binary()))
    assert result.failures == ()
    assert guard.schema == inner.schema
