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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.codecs.base import ArrowDecoder, DecodeResult
from thalweg.codecs.guard import with_failures
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
        refused = np.zeros(len(values), np.bool_)
        refused[[f.row for f in failures]] = True
        nulled = result.table.take(pa.array(np.arange(len(values)), mask=refused))
        return with_failures(result, failures, nulled)
