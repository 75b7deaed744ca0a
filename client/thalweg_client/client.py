"""The client: tickets as plain dicts, reads as Arrow tables and readers."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

Position = str | dict[str, int]


def ticket(
    topic: str,
    *,
    lane: str = "decoded",
    partitions: list[int] | None = None,
    start: Position = "earliest",
    end: Position = "now",
    metadata: str = "locator",
    columns: list[str] | None = None,
    filter: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The JSON ticket for a read (the same object any language can send).

    Args:
        topic: topic to read.
        lane: ``"decoded"`` (payload columns) or ``"raw"`` (bytes + all metadata).
        partitions: subset of partitions, all when None.
        start: ``"earliest"`` | ``"latest"`` | ``{"offset": N}`` | ``{"timestamp_ms": N}``.
        end: ``"now"`` | ``"follow"`` | ``{"offset": N}`` (exclusive) | ``{"timestamp_ms": N}``.
        metadata: ``"none"`` | ``"locator"`` | ``"all"`` metadata columns (decoded lane).
        columns: output columns to keep, in order.
        filter: conditions that must all hold, e.g.
            ``[{"column": "id", "op": ">=", "value": 10}]`` (ops ``== != < <= > >= in
            is_null is_valid``); pushed into the gateway's Parquet scans where possible.
    """
    out: dict[str, Any] = {
        "topic": topic,
        "lane": lane,
        "start": start,
        "end": end,
        "metadata": metadata,
    }
    if partitions is not None:
        out["partitions"] = list(partitions)
    if columns is not None:
        out["columns"] = list(columns)
    if filter is not None:
        out["filter"] = [dict(c) for c in filter]
    return out


class Client:
    """A connection to one gateway."""

    def __init__(self, location: str, *, token: str | None = None, **kwargs: Any) -> None:
        self.location = location
        self._flight = fl.FlightClient(location, **kwargs)
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._options = fl.FlightCallOptions(headers=headers)
        # Strong references: the RecordBatchReader handed out does not keep these alive.
        self._streams: list[fl.FlightStreamReader] = []

    def topics(self) -> list[str]:
        """Topics the gateway can serve."""
        names = []
        for info in self._flight.list_flights(options=self._options):
            path = [p.decode() if isinstance(p, bytes) else p for p in info.descriptor.path]
            names.append(path[1])
        return sorted(names)

    def schema(self, topic: str, **options: Any) -> pa.Schema:
        """The schema a read with ``options`` would return."""
        desc = fl.FlightDescriptor.for_command(json.dumps(ticket(topic, **options)))
        return self._flight.get_schema(desc, options=self._options).schema

    def stream(self, topic: str, **options: Any) -> pa.RecordBatchReader:
        """One stream over all requested partitions (use ``end="follow"`` to tail).

        A follow stream runs until :meth:`close` (or leaving the ``with`` block).
        """
        body = json.dumps(ticket(topic, **options)).encode()
        reader = self._flight.do_get(fl.Ticket(body), options=self._options)
        self._streams.append(reader)
        return reader.to_reader()

    def read(self, topic: str, *, parallel: int = 4, **options: Any) -> pa.Table:
        """A bounded read as one table, fetching the partitions' endpoints in parallel.

        Raises:
            ValueError: ``end="follow"`` never ends; use :meth:`stream`.
        """
        if options.get("end") == "follow":
            raise ValueError("read() needs a bounded end; use stream() to follow")
        desc = fl.FlightDescriptor.for_command(json.dumps(ticket(topic, **options)))
        info = self._flight.get_flight_info(desc, options=self._options)

        def fetch(endpoint: fl.FlightEndpoint) -> pa.Table:
            return self._flight.do_get(endpoint.ticket, options=self._options).read_all()

        with ThreadPoolExecutor(max(1, parallel)) as pool:
            tables = list(pool.map(fetch, info.endpoints))
        if not tables:
            return info.schema.empty_table()
        return pa.concat_tables(tables)

    def write(
        self,
        topic: str,
        table: pa.Table | pa.RecordBatch,
        *,
        key: Any = None,
        headers: Any = None,
        partition: Any = None,
        timestamp: Any = None,
    ) -> list[dict[str, Any]]:
        """Produce ``table``'s rows into ``topic`` through the gateway.

        ``table`` has either a ``value`` column (the payloads) or payload columns the
        gateway encodes with the topic's format. ``key``, ``headers``, ``partition`` and
        ``timestamp`` may be columns of ``table`` or given here (one value per row).

        Returns:
            One acknowledgement per batch: ``{"rows": n, "partitions": {"<p>": [first,
            last]}}`` with the offsets the broker assigned.
        """
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        for name, values in (
            ("key", key),
            ("headers", headers),
            ("partition", partition),
            ("timestamp", timestamp),
        ):
            if values is not None:
                table = table.append_column(
                    name,
                    pa.array(values)
                    if not isinstance(values, pa.Array | pa.ChunkedArray)
                    else values,
                )
        descriptor = fl.FlightDescriptor.for_path("topics", topic)
        writer, reader = self._flight.do_put(descriptor, table.schema, options=self._options)
        acks = []
        try:
            for batch in table.to_batches(max_chunksize=65536):
                writer.write_batch(batch)
                acks.append(json.loads(reader.read().to_pybytes()))
            writer.done_writing()
        finally:
            writer.close()
        return acks

    def describe(self, topic: str) -> dict[str, Any]:
        """Partitions of ``topic`` with their earliest, durable, committed and latest
        positions."""
        action = fl.Action("describe-topic", json.dumps({"topic": topic}).encode())
        results = list(self._flight.do_action(action, options=self._options))
        answer: dict[str, Any] = json.loads(results[0].body.to_pybytes())
        return answer

    def close(self) -> None:
        """Cancel open streams (a follow stream ends on the server too), then close.

        gRPC does not cancel in-flight calls when a channel closes, so a follow stream
        would otherwise keep running on the gateway.
        """
        for reader in self._streams:
            reader.cancel()
        self._streams.clear()
        self._flight.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(location: str, *, token: str | None = None, **kwargs: Any) -> Client:
    """Connect to a gateway at ``location`` (e.g. ``grpc://127.0.0.1:8815``); ``token``
    is sent as a bearer token on every call when the gateway requires one."""
    return Client(location, token=token, **kwargs)
