"""The decoder of file rows: typed fields from a file reader, checked into the lane.

A file's reader (Parquet, CSV, JSON lines, Avro, Arrow IPC, Excel) already produced
typed columns, so "decoding" a file row is admitting its fields into the lane schema
the way every other decoder does — a reserved field name, a type that contradicts the
lane, or a schema past ``schema_limits`` fails the rows with the same reasons — and
turning the rows the reader could not parse into ``syntax`` failures with the reader's
message. Values arrive as the struct column :func:`thalweg.records.file_rows.
file_rows_batch` builds; anything else (bytes from a broker) is not a file row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from thalweg.codecs.base import (
    DecodeFailure,
    DecodeReason,
    DecodeResult,
    LaneDecoder,
    admit,
    assemble,
    conform,
)
from thalweg.errors import InvariantError


class ArrowRowDecoder(LaneDecoder):
    """Admits typed file rows into the decoded lane (see the module docstring)."""

    def _decode(self, values: pa.Array) -> DecodeResult:
        n = len(values)
        if not pa.types.is_struct(values.type):
            msg = "not a file row: a files source decodes rows from its reader, not bytes"
            rows = np.flatnonzero(values.is_valid().to_numpy(zero_copy_only=False))
            refused = [DecodeFailure(int(r), DecodeReason.UNSUPPORTED, msg) for r in rows]
            return assemble(n, self._schema, [], refused)
        if not isinstance(values, pa.StructArray):
            raise InvariantError("values is not a pa.StructArray")
        err_name = self._columns.file_error
        names = [values.type.field(i).name for i in range(values.type.num_fields)]
        fields = values.flatten()
        by_name = dict(zip(names, fields, strict=True))
        errors = by_name.pop(err_name, None)
        failures: list[DecodeFailure] = []
        good = np.arange(n, dtype=np.int64)
        if errors is not None and errors.null_count < n:
            bad = errors.is_valid().to_numpy(zero_copy_only=False)
            failures = [
                DecodeFailure(int(r), DecodeReason.SYNTAX, str(errors[int(r)].as_py()))
                for r in np.flatnonzero(bad)
            ]
            good = np.flatnonzero(~bad).astype(np.int64)
        table = pa.table(by_name) if by_name else pa.table({})
        group = table.schema
        widened, refused = admit(
            self._schema,
            group,
            good,
            "the file's columns",
            self._columns,
            (self._limits, self.shape),
        )
        if widened is None:
            return assemble(n, self._schema, [], [*failures, *refused])
        self._schema = widened
        if not by_name:
            return assemble(n, self._schema, [], failures)
        if not failures:  # every row parsed and fits: no copy into place
            return DecodeResult(conform(table, widened), _no_errors(n), ())
        piece = table.take(pa.array(good)) if len(good) < n else table
        return assemble(n, self._schema, [(good, piece)], failures)


def _no_errors(n: int) -> pa.StringArray:
    errors = pa.nulls(n, pa.string())
    if not isinstance(errors, pa.StringArray):
        raise InvariantError("errors is not a pa.StringArray")
    return errors
