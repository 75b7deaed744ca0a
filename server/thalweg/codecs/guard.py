"""Guards in front of any decoder: rows the decoder must not see become failures.

A payload larger than ``max_bytes`` is not handed to the decoder at all (a runaway
record can cost a parser far more memory than its size): an ``oversize`` failure. A
payload whose writer schema stayed unreachable past the retry bound is not either: a
``retry_exhausted`` failure (decoding it would only report an unknown schema, and the
decoder might remember that). Either way the row stays aligned, decoded as nothing, so
it reaches the dead-letter lane like any failure, and the raw lane keeps it whole. The
checks are vectorised and free when nothing is withheld.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.codecs.base import ArrowDecoder, DecodeFailure, DecodeReason, DecodeResult
from thalweg.codecs.framing import peel


def decode_withholding(
    inner: ArrowDecoder,
    values: pa.Array,
    withheld: npt.NDArray[np.bool_],
    failures: list[DecodeFailure],
) -> DecodeResult:
    """Decode ``values`` except the ``withheld`` rows, which fail with ``failures``."""
    # Hand the decoder a tombstone in their place: rows stay aligned, nothing parses.
    masked = pc.if_else(pa.array(withheld), pa.scalar(None, values.type), values)
    return with_failures(inner.decode(masked), failures)


def with_failures(
    result: DecodeResult, failures: list[DecodeFailure], table: pa.Table | None = None
) -> DecodeResult:
    """``result`` with more failed rows: their error texts set, the failures merged in
    row order, and (when a guard refused rows that had decoded) the nulled ``table``."""
    errors = result.errors.to_pylist()
    for f in failures:
        errors[f.row] = f"{f.reason.value}: {f.message}"
    return dataclasses.replace(
        result,
        table=result.table if table is None else table,
        errors=pa.array(errors, pa.string()),
        failures=tuple(sorted((*result.failures, *failures), key=lambda f: f.row)),
    )


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
        mask = np.asarray(over)
        rows = np.flatnonzero(mask)
        sizes = np.asarray(lengths)[rows]
        failures = [
            DecodeFailure(
                int(r),
                DecodeReason.OVERSIZE,
                f"payload of {int(n)} bytes exceeds max_record_bytes ({self.max_bytes})",
            )
            for r, n in zip(rows, sizes, strict=True)
        ]
        return decode_withholding(self._inner, values, mask, failures)


class SchemaGate:
    """An :class:`ArrowDecoder` that withholds payloads framed with certain schema ids.

    ``withheld()`` is read at every batch (the engine swaps the set from its event loop;
    replacing a frozenset is atomic for the decoding thread), so a registry that comes
    back lets the next batch through.
    """

    def __init__(
        self, inner: ArrowDecoder, withheld: Callable[[], frozenset[int]], why: str
    ) -> None:
        self._inner = inner
        self._withheld = withheld
        self._why = why

    @property
    def schema(self) -> pa.Schema:
        return self._inner.schema

    def decode(self, values: pa.Array) -> DecodeResult:
        ids = self._withheld()
        if not ids:
            return self._inner.decode(values)
        framed = peel(values).ids
        mask = np.isin(framed, np.fromiter(ids, np.int64, len(ids)))
        if not mask.any():
            return self._inner.decode(values)
        failures = [
            DecodeFailure(
                int(r), DecodeReason.RETRY_EXHAUSTED, f"schema id {int(framed[r])}: {self._why}"
            )
            for r in np.flatnonzero(mask)
        ]
        return decode_withholding(self._inner, values, mask, failures)
