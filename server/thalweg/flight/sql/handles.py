"""Statement handles: the query (and its bound parameters) in the handle itself.

A handle — the ticket of a query, a prepared statement — carries everything needed to
run it: the SQL text and, once a client has bound them, the parameter values as an Arrow
IPC stream. Nothing is kept on the gateway between calls, so a handle works on any
gateway of the group, survives a restart, and there is nothing to expire or leak; the
caller's rights are checked again each time it is used. Flight SQL's
``DoPutPreparedStatementResult`` exists for this: binding returns the new handle.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

import pyarrow as pa

from thalweg.flight.errors import InvalidArgumentError

MAX_HANDLE_BYTES = 4 * 1024 * 1024
_MAGIC = "twg-sql"
_VERSION = 1


@dataclass(frozen=True, slots=True)
class Statement:
    """A query, its bound parameters (a one-row batch, or None) and, for an endpoint of
    a query split by partition, the partitions that endpoint reads."""

    sql: str
    params: pa.RecordBatch | None = None
    partitions: tuple[int, ...] | None = None

    def encode(self) -> bytes:
        body: dict[str, object] = {"f": _MAGIC, "v": _VERSION, "sql": self.sql}
        if self.partitions is not None:
            body["partitions"] = list(self.partitions)
        if self.params is not None:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, self.params.schema) as w:
                w.write_batch(self.params)
            body["params"] = base64.b64encode(sink.getvalue().to_pybytes()).decode()
        data = json.dumps(body).encode()
        if len(data) > MAX_HANDLE_BYTES:
            raise InvalidArgumentError(
                f"a statement with its parameters is {len(data)} bytes; at most "
                f"{MAX_HANDLE_BYTES} are accepted"
            )
        return data

    @staticmethod
    def decode(data: bytes) -> Statement:
        """Raises:
        InvalidArgumentError: not a handle this gateway issued (or a damaged one)."""
        if len(data) > MAX_HANDLE_BYTES:
            raise InvalidArgumentError("statement handle too large")
        try:
            body = json.loads(data)
            if body.get("f") != _MAGIC or body.get("v") != _VERSION:
                raise ValueError("not a Thalweg statement handle")
            sql = body["sql"]
            if not isinstance(sql, str):
                raise TypeError("sql is not text")
            parts = body.get("partitions")
            if parts is not None and not (
                isinstance(parts, list) and all(type(p) is int and p >= 0 for p in parts)
            ):
                raise TypeError("partitions is not a list of partition numbers")
            params = None
            if body.get("params") is not None:
                raw = base64.b64decode(body["params"], validate=True)
                params = pa.ipc.open_stream(raw).read_all().combine_chunks().to_batches()[0]
        except (
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
            IndexError,
            RecursionError,
            binascii.Error,
            pa.ArrowException,
        ) as exc:
            raise InvalidArgumentError(f"invalid statement handle: {exc}") from exc
        return Statement(sql, params, tuple(parts) if parts is not None else None)
