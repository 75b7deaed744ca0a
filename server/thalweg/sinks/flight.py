"""An Arrow Flight server: one ``do_put`` per topic and flush, to ``path`` with ``{topic}``
— or, with a field in ``path`` (``"tenants/{tenant}"``), one per path the rows name.

At-least-once, not exactly-once: Flight has no transaction and the receiver keeps no
coverage this sink could read back, so a ``do_put`` that failed after the server had
stored part (or all) of it counts as nothing here, and the feeder sends those rows again
whole. The receiver deduplicates by ``_twg_record_id``, which every batch carries. For the
same reason ``_open`` answers None: the coverage store is the only record.

A flush counts only once ``close()`` of every topic's writer returned without error —
gRPC reports the server's final status there, so that is the server's acknowledgement
that it took the whole stream. The call's timeout (``timeout_s``) bounds the whole
stream, not each batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
from pyarrow import flight

from thalweg.config.sinks import FlightSinkConfig
from thalweg.records.columns import MetadataColumns
from thalweg.sinks import routes
from thalweg.sinks.base import BufferedSink, Ranges, SinkUnavailableError
from thalweg.sinks.contract import Capabilities

# What a failed call or a broken connection raises: Flight's errors (their base class
# is not an ArrowException), Arrow's, and the socket's.
_FAILURES = (flight.FlightError, pa.ArrowException, OSError)


class FlightSink(BufferedSink[FlightSinkConfig]):
    kind = "flight"
    guarantee = "at-least-once"
    # The receiver keeps no record of its own: the coverage store is the only one, and
    # nothing can be read back (``holds`` is the default's).
    capabilities = Capabilities(
        upsert=False, routing=True, refuses_values=False, reads_back=False, rebuilds_dropped=False
    )

    def __init__(
        self, cfg: FlightSinkConfig, data_dir: Path, columns: MetadataColumns | None = None
    ) -> None:
        super().__init__(cfg, data_dir, columns)
        self._client: flight.FlightClient | None = None
        self.routed = routes.routed(cfg.path)  # a put per value of a row's field
        self._paths: set[str] = set()  # the routed paths put to since start (max_paths)

    def descriptor_path(self, topic: str) -> str:
        """``path`` for ``topic`` (split on "/" into descriptor parts: "topics/{topic}"
        is another gateway's ``["topics", <topic>]``)."""
        return str(self.cfg.path.replace("{topic}", topic))

    def _options(self) -> flight.FlightCallOptions:
        headers: list[tuple[bytes, bytes]] = []
        if self.cfg.token is not None:
            token = self.cfg.token.get_secret_value()
            headers.append((b"authorization", b"Bearer " + token.encode()))
        return flight.FlightCallOptions(timeout=self.cfg.timeout_s, headers=headers)

    def _connect(self) -> flight.FlightClient:
        # The client connects lazily and is reused across flushes; it is dropped after
        # any failure so the next flush starts on a fresh channel.
        if self._client is None:
            self._client = flight.FlightClient(self.cfg.location)
        return self._client

    def _commit(self, rows: Mapping[str, list[pa.Table]], covered: Ranges) -> None:
        # Spans without rows (dead letters, markers) need no call: with no coverage kept
        # at the receiver there is nothing to record for them.
        by_topic = {
            t: pa.concat_tables(rows[t], promote_options="permissive")
            for t in sorted(rows)
            if rows[t]
        }
        # A routed path ("tenants/{tenant}"): a put per path the rows name; rows naming
        # none, or one path past max_paths, refused by name (sinks/routes.py).
        puts = (
            routes.assign(
                by_topic,
                self.cfg.path,
                self._paths,
                self.cfg.max_paths,
                self.name,
                self.columns,
                whole=False,
            )
            if self.routed
            else {(self.descriptor_path(t), t): table for t, table in by_topic.items()}
        )
        for (path, _), table in sorted(puts.items()):
            try:
                self._put(path, table)
                self._paths.add(path)
            except (flight.FlightUnauthenticatedError, flight.FlightUnauthorizedError) as exc:
                self._drop_client()
                what = (
                    "unauthenticated"
                    if isinstance(exc, flight.FlightUnauthenticatedError)
                    else "unauthorized"
                )
                raise SinkUnavailableError(
                    f"flight sink {self.name!r} at {self.cfg.location}: {what} "
                    f"(check the sink's token): {_one_line(exc)}"
                ) from exc
            except _FAILURES as exc:
                self._drop_client()
                raise SinkUnavailableError(
                    f"flight sink {self.name!r} at {self.cfg.location}: do_put "
                    f"{path!r} failed: {_one_line(exc)}"
                ) from exc

    def _put(self, path: str, table: pa.Table) -> None:
        descriptor = flight.FlightDescriptor.for_path(*path.split("/"))
        writer, acks = self._connect().do_put(descriptor, table.schema, self._options())
        try:
            writer.write_table(table)
            writer.done_writing()
            # A server may answer with application metadata; it is not needed (close()
            # carries the status), but it is read so the server never blocks on it.
            ack = acks.read()
            while ack is not None:
                ack = acks.read()
        finally:
            # Raises the server's error if the put failed: the acknowledgement is this
            # returning cleanly.
            writer.close()

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            # Thrown away because it already failed: an error closing it says nothing new.
            with contextlib.suppress(*_FAILURES):
                client.close()

    def _close(self) -> None:
        self._drop_client()


def _one_line(exc: BaseException) -> str:
    """A Flight error's message without the debug context gRPC appends to it (which
    repeats the message), on one line for /health."""
    text = " ".join(str(exc).split())
    for tail in (". Detail:", ". gRPC client debug context:"):
        text = text.partition(tail)[0]
    return text or type(exc).__name__
