"""A data contract in front of the decoded lane: rows that break it become failures.

Wraps any :class:`~thalweg.codecs.base.ArrowDecoder` (as the size guard does), so a
contract needs no change to any codec and holds for Kafka and Pulsar alike. A row that
breaks the contract is treated like one that did not decode: its payload columns are
null in the decoded lane, ``_twg_decode_error`` says ``contract: ...`` or
``quality: ...``, and the whole raw record goes to the dead-letter lane (stage
``contract``) before its position is committed. Tombstones (null payloads) and rows
that already failed to decode are not judged.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.codecs.base import ArrowDecoder, DecodeResult
from thalweg.contracts.checks import CompiledContract


class ContractGuard:
    """An :class:`ArrowDecoder` that enforces a compiled contract object."""

    def __init__(self, inner: ArrowDecoder, contract: CompiledContract) -> None:
        self._inner = inner
        self.contract = contract

    @property
    def schema(self) -> pa.Schema:
        return self._inner.schema

    def decode(self, values: pa.Array) -> DecodeResult:
        result = self._inner.decode(values)
        eligible = np.asarray(
            pc.and_(pc.is_valid(values), pc.is_null(result.errors)).to_numpy(zero_copy_only=False),
            np.bool_,
        )
        if not self.contract.checks or not eligible.any():
            return result
        failures = self.contract.evaluate(result.table, eligible)
        if not failures:
            return result
        rows = np.array([f.row for f in failures], np.int64)
        take = np.arange(len(values), dtype=np.int64)
        keep = np.ones(len(values), np.bool_)
        keep[rows] = False
        table = result.table.take(pa.array(take, mask=~keep))
        errors = result.errors.to_pylist()
        for f in failures:
            errors[f.row] = f"{f.reason.value}: {f.message}"
        return dataclasses.replace(
            result,
            table=table,
            errors=pa.array(errors, pa.string()),
            failures=tuple(sorted((*result.failures, *failures), key=lambda f: f.row)),
        )
