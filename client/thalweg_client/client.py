"""The client: tickets as plain dicts, reads as Arrow tables and readers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from thalweg_client.spread import SpreadStream, relocation
from thalweg_client.wire import encode_ticket

#: Put batches written before the first unread acknowledgement is read.
WRITE_AHEAD = 1
AHEAD_METADATA = pa.py_buffer(json.dumps({"write_ahead": WRITE_AHEAD}).encode())

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
    epoch: int | None = None,
    view: str = "all",
    sink: str | None = None,
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
        epoch: a closed epoch of the topic's lane (``describe()`` lists them); the
            current one when None. A partition's epoch closes when its broker log stopped
            continuing the lane (docs/lanes.md).
        view: ``"latest"``: one row per record key, the newest, deleted keys absent
            (docs/cdc.md); ``"all"``: every record.
        sink: with ``lane="dlq"``, the records that sink's destination refused
            (docs/sinks.md) instead of the topic's decode failures (JSON tickets only).
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
    if epoch is not None:
        out["epoch"] = epoch
    if view != "all":
        out["view"] = view
    if sink is not None:
        out["sink"] = sink
    return out


class Client:
    """A connection to one gateway."""

    def __init__(
        self,
        location: str,
        *,
        token: str | None = None,
        username: str | None = None,
        password: str | None = None,
        tls_root_certs: bytes | None = None,
        cert_chain: bytes | None = None,
        private_key: bytes | None = None,
        ticket_encoding: str = "json",
        **kwargs: Any,
    ) -> None:
        if ticket_encoding not in ("json", "protobuf"):
            raise ValueError("ticket_encoding is 'json' or 'protobuf'")
        if token is not None and username is not None:
            raise ValueError("give a token or a username/password, not both")
        self.location = location
        self._encoding = ticket_encoding
        for name, value in (
            ("tls_root_certs", tls_root_certs),
            ("cert_chain", cert_chain),
            ("private_key", private_key),
        ):
            if value is not None:
                kwargs[name] = value
        self._flight = fl.FlightClient(location, **kwargs)
        self._kwargs = kwargs
        self._others: dict[str, fl.FlightClient] = {}
        self._others_lock = threading.Lock()
        headers: list[tuple[bytes, bytes]] = []
        if token:
            headers = [(b"authorization", f"Bearer {token}".encode())]
        elif username is not None:
            # Flight's basic-token handshake: the gateway answers with a session token.
            headers = [self._flight.authenticate_basic_token(username, password or "")]
        self._headers = headers
        self._options = fl.FlightCallOptions(headers=headers)
        # Strong references: the RecordBatchReader handed out does not keep these alive.
        self._streams: list[fl.FlightStreamReader | SpreadStream] = []

    def topics(self) -> list[str]:
        """Topics the gateway can serve."""
        return self._listed("topics")

    def nodes(self) -> list[str]:
        """Pipeline nodes the gateway can serve (read them like topics)."""
        return self._listed("nodes")

    def _listed(self, kind: str) -> list[str]:
        names = []
        for info in self._flight.list_flights(options=self._options):
            path = [p.decode() if isinstance(p, bytes) else p for p in info.descriptor.path]
            if len(path) == 2 and path[0] == kind:
                names.append(path[1])
        return sorted(names)

    def schema(self, topic: str, **options: Any) -> pa.Schema:
        """The schema a read with ``options`` would return."""
        desc = fl.FlightDescriptor.for_command(self._encode(ticket(topic, **options)))
        return self._flight.get_schema(desc, options=self._options).schema

    def stream(self, topic: str, **options: Any) -> pa.RecordBatchReader:
        """One stream over all requested partitions (use ``end="follow"`` to tail).

        A follow stream runs until :meth:`close` (or leaving the ``with`` block). With
        several gateways on one consumer group, partitions this gateway does not serve
        are read from their owners, and a partition that moves (a rebalance, a gateway
        that died) continues at its new owner without a gap or a duplicate
        (:mod:`thalweg_client.spread`).
        """
        base = ticket(topic, **options)
        try:
            reader = self._flight.do_get(fl.Ticket(self._encode(base)), options=self._options)
            schema = reader.schema
        except fl.FlightError as exc:
            moved = relocation(exc)
            if moved is None:
                raise
            return self._spread(base, None, moved or None)
        self._streams.append(reader)

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                for chunk in reader:
                    yield chunk.data
            except fl.FlightError as exc:
                moved = relocation(exc)
                if moved is None:
                    raise
                yield from self._spread(base, schema, moved or None)

        return pa.RecordBatchReader.from_batches(schema, batches())

    def _spread(
        self, base: dict[str, Any], schema: pa.Schema | None, positions: dict[int, int] | None
    ) -> pa.RecordBatchReader:
        if schema is None:
            desc = fl.FlightDescriptor.for_command(self._encode(base))
            schema = self._flight.get_flight_info(desc, options=self._options).schema
        spread = SpreadStream(
            self._flight, self._at, self._options, self._encode, base, schema, positions
        )
        self._streams.append(spread)
        return pa.RecordBatchReader.from_batches(schema, spread.batches())

    def _at(self, location: str | None) -> fl.FlightClient:
        """A client for an endpoint's location (this gateway's own when it is its own)."""
        if not location or location == self.location:
            return self._flight
        with self._others_lock:
            found = self._others.get(location)
            if found is None:
                found = self._others[location] = fl.FlightClient(location, **self._kwargs)
            return found

    def read(self, topic: str, *, parallel: int = 4, **options: Any) -> pa.Table:
        """A bounded read as one table, fetching the partitions' endpoints in parallel.

        Raises:
            ValueError: ``end="follow"`` never ends; use :meth:`stream`.
        """
        if options.get("end") == "follow":
            raise ValueError("read() needs a bounded end; use stream() to follow")
        desc = fl.FlightDescriptor.for_command(self._encode(ticket(topic, **options)))
        info = self._flight.get_flight_info(desc, options=self._options)

        def fetch(endpoint: fl.FlightEndpoint) -> pa.Table:
            # Each endpoint names the gateway that serves its partition (its owner when
            # several gateways share the topic).
            loc = endpoint.locations[0].uri.decode() if endpoint.locations else None
            return self._at(loc).do_get(endpoint.ticket, options=self._options).read_all()

        with ThreadPoolExecutor(max(1, parallel)) as pool:
            tables = list(pool.map(fetch, info.endpoints))
        return _joined(tables, info.schema)

    def read_node(self, node: str) -> pa.Table:
        """A pipeline node's rows as one table (docs/pipeline.md), with the locators of
        the records they came from — the same as ``read(node)``; ``stream(node,
        end="follow")`` follows it."""
        desc = fl.FlightDescriptor.for_path("nodes", node)
        info = self._flight.get_flight_info(desc, options=self._options)
        tables = [
            self._flight.do_get(e.ticket, options=self._options).read_all() for e in info.endpoints
        ]
        return _joined(tables, info.schema)

    def to_pandas(self, topic: str, **options: Any) -> Any:
        """:meth:`read` as a pandas DataFrame (needs pandas installed)."""
        return self.read(topic, **options).to_pandas()

    def to_polars(self, topic: str, **options: Any) -> Any:
        """:meth:`read` as a polars DataFrame (needs polars installed)."""
        try:
            import polars
        except ImportError as exc:
            raise ImportError("to_polars needs polars: pip install polars") from exc
        return polars.from_arrow(self.read(topic, **options))

    def endpoints(self, topic: str, **options: Any) -> fl.FlightInfo:
        """The read's FlightInfo: schema, endpoints (tickets and locations) and totals —
        for spreading a read over workers yourself (see :mod:`thalweg_client.spark`)."""
        desc = fl.FlightDescriptor.for_command(self._encode(ticket(topic, **options)))
        return self._flight.get_flight_info(desc, options=self._options)

    @property
    def call_headers(self) -> list[tuple[bytes, bytes]]:
        """The headers sent on every call (a worker re-uses them to fetch endpoints)."""
        return list(self._headers)

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

        Batches of 64k rows are sent one ahead of their acknowledgements. If the put
        fails, the error names how many rows were acknowledged; rows after those may
        have landed as well.

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
        acks: list[dict[str, Any]] = []
        sent = 0
        try:
            for batch in table.to_batches(max_chunksize=65536):
                if sent:
                    writer.write_batch(batch)
                else:  # tell the gateway it may read this far ahead of its acks
                    writer.write_with_metadata(batch, AHEAD_METADATA)
                sent += 1
                # One batch ahead: the gateway encodes the next batch while the broker
                # acknowledges the last.
                while sent - len(acks) > WRITE_AHEAD:
                    acks.append(json.loads(reader.read().to_pybytes()))
            writer.done_writing()
            while len(acks) < sent:
                acks.append(json.loads(reader.read().to_pybytes()))
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

    def _encode(self, t: dict[str, Any]) -> bytes:
        if self._encoding == "protobuf":
            return encode_ticket(t)
        return json.dumps(t).encode()

    def close(self) -> None:
        """Cancel open streams (a follow stream ends on the server too), then close.

        gRPC does not cancel in-flight calls when a channel closes, so a follow stream
        would otherwise keep running on the gateway.
        """
        for reader in self._streams:
            reader.cancel()
        self._streams.clear()
        with self._others_lock:
            others = list(self._others.values())
            self._others.clear()
        for other in others:
            other.close()
        self._flight.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(location: str, *, token: str | None = None, **kwargs: Any) -> Client:
    """Connect to a gateway.

    Args:
        location: ``grpc://host:port``, or ``grpc+tls://host:port`` for a TLS gateway.
        token: a bearer token, sent on every call.
        username, password: sign in with basic credentials instead; the gateway hands
            back a session token that is sent from then on.
        tls_root_certs: PEM CA bundle to trust (a private CA); system roots otherwise.
        cert_chain, private_key: PEM client certificate and key, for mutual TLS.
        ticket_encoding: ``"json"`` (default) or ``"protobuf"`` tickets on the wire.
    """
    return Client(location, token=token, **kwargs)


def _joined(tables: list[pa.Table], planned: pa.Schema) -> pa.Table:
    """The endpoints' tables as one. Each endpoint is answered when it is fetched, with
    the lane's schema then: a field first decoded between the plan and a fetch (a topic's
    first records, an added field) is in some tables and not others, and a widened type
    (int to double) is wider in the later ones. The lane's schema only grows, so the
    union is exact: the rows answered before a field existed hold null there."""
    if not tables:
        return planned.empty_table()
    return pa.concat_tables(tables, promote_options="permissive")
