"""Write a Thalweg sidecar transform in a few lines (``docs/sidecars.md``).

A sidecar is a Flight server the gateway calls with ``do_exchange`` for a node of its
pipeline. Subclass :class:`Sidecar`, implement :meth:`Sidecar.transform`, serve::

    class Enrich(Sidecar):
        def transform(self, command, batch):
            tier = pc.if_else(pc.greater(batch.column("amount"), 100), "gold", "basic")
            return batch.append_column("tier", tier)

    Enrich("grpc://127.0.0.1:9100").serve()

The wire contract this class keeps (pinned by the gateway's golden tests):

* the descriptor is a command descriptor; its bytes are the node's ``command`` (one
  sidecar can offer several transforms);
* the gateway writes record batches of the node's input, each carrying the ``_twg_``
  locator columns of its records; for **every** batch it writes, the sidecar writes back
  **exactly one** batch (zero rows allowed), in order, with the schema it declared when
  the stream began (:meth:`Sidecar.output_schema`);
* each output row says which input row it came from: it keeps the input's locator
  columns (a transform that appends or computes columns, or filters, does so by
  default), or it carries an ``_twg_row`` int64 column, the row's index in its input
  batch (RisingWave ``arrow-udf``'s shape, for transforms that build new rows) — the
  gateway then takes the locators from the input itself;
* an error is raised as a Flight error (its message reaches the gateway's /health).
"""

from __future__ import annotations

import hmac
from abc import ABC, abstractmethod
from typing import Any

import pyarrow as pa
from pyarrow import flight

ROW_INDEX = "_twg_row"


class _BearerCheck(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}"

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> None:
        got = headers.get("authorization", [])
        if not any(hmac.compare_digest(g.encode(), self._expected.encode()) for g in got):
            raise flight.FlightUnauthenticatedError("a valid bearer token is required")


class Sidecar(flight.FlightServerBase, ABC):  # type: ignore[misc]
    """A do_exchange transform server.

    Args:
        location: where to listen, e.g. ``grpc://127.0.0.1:9100`` (port 0: any free).
        token: when set, every call must carry ``authorization: Bearer <token>``.
        kwargs: passed to ``pyarrow.flight.FlightServerBase`` (TLS certificates...).
    """

    def __init__(
        self, location: str = "grpc://127.0.0.1:0", *, token: str | None = None, **kwargs: Any
    ) -> None:
        middleware = {"auth": _BearerCheck(token)} if token else None
        super().__init__(location, middleware=middleware, **kwargs)

    def output_schema(self, command: str, input_schema: pa.Schema) -> pa.Schema | None:
        """The schema of the rows this transform writes back, declared when the stream
        begins; None (the default) takes the schema of the first output batch."""
        return None

    @abstractmethod
    def transform(self, command: str, batch: pa.RecordBatch) -> pa.RecordBatch | pa.Table:
        """The rows derived from ``batch``: zero, one or many per input row, each with
        the input's locator columns or an ``_twg_row`` index (module docstring)."""

    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        command = descriptor.command.decode() if descriptor.command is not None else ""
        schema = self.output_schema(command, reader.schema)
        started = False
        while True:
            try:
                chunk = reader.read_chunk()
            except StopIteration:
                break
            if chunk.data is None:
                continue
            out = self.transform(command, chunk.data)
            table = out if isinstance(out, pa.Table) else pa.Table.from_batches([out])
            if schema is None:
                schema = table.schema
            if not started:
                writer.begin(schema)
                started = True
            table = table.cast(schema) if table.schema != schema else table
            combined = table.combine_chunks()
            batches = combined.to_batches()
            # Exactly one batch per input batch, also when it derived no rows.
            writer.write_batch(batches[0] if batches else _empty(schema))
        if not started:
            writer.begin(schema if schema is not None else reader.schema)


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)
