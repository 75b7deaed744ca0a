"""Produce records into Pulsar topics (``do_put`` on a Pulsar source's topic, and tests).

The official ``pulsar-client`` is thread-based: ``send_async`` callbacks run on its I/O
threads and are handed to the event loop, so a batch of records is sent without a
thread per record and acknowledged in order.

The record model is Kafka-shaped and Pulsar's is not the same, so the mapping refuses
what it cannot carry instead of bending it: properties are a map of UTF-8 strings
(a repeated header key, a null header value or non-UTF-8 bytes are refused), a key is a
UTF-8 string (``partition_key``), and Pulsar has no null-value tombstone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from thalweg.errors import InvariantError, ProduceError, ThalwegError
from thalweg.records.model import RawRecord


@dataclass(frozen=True, slots=True)
class PulsarWritten:
    """Where one record landed: the serialized message id and its parts."""

    message_id: bytes
    ledger_id: int
    entry_id: int
    batch_index: int
    partition: int


def pulsar_fields(r: RawRecord) -> dict[str, Any]:
    """The ``send_async`` arguments for ``r``; raises ThalwegError for what Pulsar
    cannot hold exactly."""
    where = f"record {r.locator.offset if r.locator.offset is not None else '?'}"
    if r.value is None:
        raise ThalwegError(f"{where}: Pulsar has no null-value (tombstone) messages")
    props: dict[str, str] = {}
    for k, v in r.headers:
        try:
            key, value = k.decode("utf-8"), None if v is None else v.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ThalwegError(
                f"{where}: header {k!r} is not UTF-8 (Pulsar properties are strings)"
            ) from exc
        if value is None:
            raise ThalwegError(f"{where}: header {key!r} has a null value (not in Pulsar)")
        if key in props:
            raise ThalwegError(f"{where}: header {key!r} repeats (Pulsar properties are a map)")
        props[key] = value
    out: dict[str, Any] = {"properties": props}
    if r.key is not None:
        try:
            out["partition_key"] = r.key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ThalwegError(f"{where}: the key is not UTF-8 (Pulsar keys are strings)") from exc
    if r.timestamp.ms is not None:
        out["event_timestamp"] = int(r.timestamp.ms)
    return out


class PulsarWriter:
    """One Pulsar client and a producer per topic, used from one event loop."""

    def __init__(self, service_url: str, **producer: Any) -> None:
        self._url = service_url
        self._producer_opts = producer
        self._client: Any = None
        self._producers: dict[str, Any] = {}

    async def start(self) -> None:
        import pulsar

        from thalweg.pulsar.client import new_client

        try:
            self._client = await asyncio.to_thread(
                new_client,
                self._url,
                operation_timeout_s=10,
                log_level=pulsar.LoggerLevel.Error,
            )
        except Exception as exc:  # pulsar raises its own hierarchy
            raise ProduceError(f"cannot connect to Pulsar at {self._url}: {exc}") from exc

    async def stop(self) -> None:
        if self._client is not None:
            await asyncio.to_thread(self._client.close)
            self._client = None
            self._producers.clear()

    async def __aenter__(self) -> PulsarWriter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def send_records(self, topic: str, records: Sequence[RawRecord]) -> list[PulsarWritten]:
        """Produce ``records`` in order and wait for every acknowledgement."""
        fields = [pulsar_fields(r) for r in records]  # refuse before sending anything
        producer = await self._producer(topic)
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Any]] = []
        for r, kw in zip(records, fields, strict=True):
            fut: asyncio.Future[Any] = loop.create_future()

            def done(res: Any, msg_id: Any, fut: asyncio.Future[Any] = fut) -> None:
                loop.call_soon_threadsafe(_settle, fut, res, msg_id)

            if r.value is None:
                raise InvariantError("r.value is not set")
            producer.send_async(r.value, done, **kw)
            futures.append(fut)
        await asyncio.to_thread(producer.flush)
        out = []
        for fut in futures:
            msg_id = await fut
            out.append(
                PulsarWritten(
                    bytes(msg_id.serialize()),
                    int(msg_id.ledger_id()),
                    int(msg_id.entry_id()),
                    int(msg_id.batch_index()),
                    int(msg_id.partition()),
                )
            )
        return out

    async def _producer(self, topic: str) -> Any:
        if self._client is None:
            raise ProduceError("PulsarWriter is not started")
        if topic not in self._producers:
            try:
                self._producers[topic] = await asyncio.to_thread(
                    self._client.create_producer, topic, **self._producer_opts
                )
            except Exception as exc:
                raise ProduceError(f"cannot create a Pulsar producer for {topic!r}: {exc}") from exc
        return self._producers[topic]


def _settle(fut: asyncio.Future[Any], res: Any, msg_id: Any) -> None:
    import pulsar

    if fut.done():
        return
    if res == pulsar.Result.Ok:
        fut.set_result(msg_id)
    else:
        fut.set_exception(ProduceError(f"Pulsar send failed: {res}"))
