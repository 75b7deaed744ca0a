"""A size limit in front of any decoder: oversize payloads become ``oversize`` failures.

A payload larger than ``max_bytes`` is not handed to the decoder at all (a runaway
record can cost a parser far more memory than its size); its row stays aligned, decoded
as nothing, with an ``oversize`` error — so it reaches the dead-letter lane like any
failure, and the raw lane keeps it whole. Sizes are read from the binary array's offsets,
so the check is vectorised and free when nothing is oversize.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.codecs.base import ArrowDecoder, DecodeFailure, DecodeReason, DecodeResult


class SizeGuard:
    """An :class:`ArrowDecoder` that refuses payloads over ``max_bytes``."""

    def __init__(self, inner: ArrowDecoder, max_bytes: int) -> None:
        self._inner = inner
        self.max_bytes = max_bytes

    @property
    def schema(self) -> pa.Schema:
        return self._inner.schema

    def decode(self, values: pa.Array) -> DecodeResult:
        lengths = pc.fill_null(pc.binary_length(values), 0)
        over = pc.greater(lengths, self.max_bytes)
        if not pc.any(over).as_py():
            return self._inner.decode(values)
        # Hand the decoder a tombstone in their place: rows stay aligned, nothing parses.
        masked = pc.if_else(over, pa.scalar(None, values.type), values)
        result = self._inner.decode(masked)
        rows = np.flatnonzero(np.asarray(over))
        sizes = np.asarray(lengths)[rows]
        failures = [
            DecodeFailure(
                int(r),
                DecodeReason.OVERSIZE,
                f"payload of {int(n)} bytes exceeds max_record_bytes ({self.max_bytes})",
            )
            for r, n in zip(rows, sizes, strict=True)
        ]
        errors = result.errors.to_pylist()
        for f in failures:
            errors[f.row] = f"{f.reason.value}: {f.message}"
        return dataclasses.replace(
            result,
            errors=pa.array(errors, pa.string()),
            failures=tuple(sorted((*result.failures, *failures), key=lambda f: f.row)),
        )
