"""The body of ``do_put``, apart from the server that dispatches to it.

A put is checked whole before its first row is produced (schema, types, the topic's
source and format), then produced batch by batch; each batch is acknowledged only once
the broker has it, and every refusal says how many rows were already acknowledged, so
the caller knows what landed for sure. A caller that sends ahead of its acknowledgements
says so (``{"write_ahead": n}`` in a batch's app metadata, as ``thalweg_client.write``
does): the next batch is then encoded and enqueued while the last is on its way to the
broker, and after a failure rows of the batches after the last acknowledged one may have
landed too (a produce retried by the caller may duplicate them, as with any Kafka
producer without idempotence).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import deque
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.flight as fl

from thalweg.config.models import BrokerSourceConfig, FlightServingConfig, PulsarSourceConfig
from thalweg.errors import InvariantError, ThalwegError, TicketError
from thalweg.flight.auth import caller_key, principal_of
from thalweg.flight.descriptors import path_topic
from thalweg.flight.errors import InvalidArgumentError
from thalweg.flight.limits import StreamLimiter
from thalweg.flight.put.encoders import avro_encoder, protobuf_encoder
from thalweg.flight.put.plan import PutPlan, plan_put, refuse_unsafe_types
from thalweg.flight.put.producers import (
    Ack,
    KafkaTopicProducer,
    PulsarTopicProducer,
    TopicProducer,
)
from thalweg.flight.tracing import call_span_context
from thalweg.kafka.clients import security_kwargs
from thalweg.kafka.producer import KafkaWriter
from thalweg.ops.metrics import Metrics
from thalweg.ops.tracing import traceparent_of
from thalweg.records.rows import ProduceRows

#: The most put batches a caller may have unacknowledged (``write_ahead``).
MAX_WRITE_AHEAD = 4


def _write_ahead(metadata: pa.Buffer, current: int) -> int:
    """The ``write_ahead`` a caller announced in a batch's app metadata
    (``{"write_ahead": n}``): it sends up to ``n`` batches before it reads the first
    unread acknowledgement, so the gateway may read (and produce) that many batches
    before it must write an acknowledgement. Without it, every batch is acknowledged
    before the next is read: a caller that waits for each acknowledgement is never left
    waiting on a read of ours."""
    try:
        said = json.loads(metadata.to_pybytes())
    except ValueError as exc:
        raise InvalidArgumentError(f"put app metadata is not JSON: {exc}") from exc
    if not isinstance(said, dict) or "write_ahead" not in said:
        return current
    n = said["write_ahead"]
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_WRITE_AHEAD:
        raise InvalidArgumentError(
            f"write_ahead must be an integer from 0 to {MAX_WRITE_AHEAD}, not {n!r}"
        )
    return n


class Puts:
    """Produces puts into the topics of the configured sources.

    Args:
        metrics: where rows and bytes produced are counted.
        limits: the batch and put size caps of the ``gateway.flight`` settings.
        streams: the per-caller stream limiter (shared with reads).
        sources: the source that lists each topic.
        pattern_sources: Kafka and Pulsar sources whose ``topics_pattern`` takes other
            topics.
        idempotent_producer: produce to Kafka with the idempotent producer.
        put_timeout_ms: how long one produce request may take.
    """

    def __init__(
        self,
        metrics: Metrics,
        limits: FlightServingConfig,
        streams: StreamLimiter,
        *,
        sources: dict[str, BrokerSourceConfig],
        pattern_sources: Sequence[BrokerSourceConfig] = (),
        idempotent_producer: bool = False,
        put_timeout_ms: int = 30_000,
    ) -> None:
        self._metrics = metrics
        self._limits = limits
        self._streams = streams
        self._sources = sources
        self._patterns = [
            (re.compile(s.topics_pattern), s) for s in pattern_sources if s.topics_pattern
        ]
        self._idempotent = idempotent_producer
        self._put_timeout_ms = put_timeout_ms

    def do_put(
        self,
        context: fl.ServerCallContext,
        descriptor: fl.FlightDescriptor,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
    ) -> int:
        """Produce the rows of ``["topics", <topic>]`` and acknowledge each batch with
        ``{"rows": n, "partitions": {"<p>": [first, last]}}`` as PutResult metadata.
        Returns the rows produced (Flight SQL's ingest reports them)."""
        topic = self._put_topic(descriptor)
        if not principal_of(context).may("write", topic):
            raise fl.FlightUnauthorizedError(f"not allowed to write to {topic!r}")
        try:
            refuse_unsafe_types(reader.schema)
            source = self.source_for(topic)
            plan = plan_put(
                topic,
                reader.schema,
                source,
                avro_encoder(topic, source),
                protobuf_encoder(topic, source),
            )
        except ThalwegError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        if source is None:
            raise InvariantError("source is not set")
        slot = self._streams.acquire(caller_key(context))
        span_ctx = call_span_context(context)
        traceparent = traceparent_of(span_ctx) if span_ctx is not None else None
        try:
            written = asyncio.run(self._produce(plan, source, reader, writer, traceparent))
        finally:
            slot.release()
        self._metrics.flight_rows.labels("do_put").inc(written)
        return written

    async def _produce(
        self,
        plan: PutPlan,
        source: BrokerSourceConfig,
        reader: fl.MetadataRecordBatchReader,
        writer: fl.FlightMetadataWriter,
        traceparent: bytes | None = None,
    ) -> int:
        """Validate, encode and produce batch by batch; every refusal says how many rows
        were already produced (and acknowledged), so the caller knows exactly what landed."""
        total = 0
        received = 0
        out = await self._started(plan, source)
        inflight: deque[tuple[asyncio.Future[Ack], int]] = deque()

        async def acknowledge() -> None:
            nonlocal total
            acked, size = inflight.popleft()
            try:
                ack = await acked
            except ThalwegError as exc:
                raise fl.FlightServerError(
                    f"producing to {plan.topic!r} failed after {total} rows: {exc}"
                ) from exc
            total += int(ack["rows"])
            self._metrics.flight_bytes.labels("do_put").inc(size)
            writer.write(pa.py_buffer(json.dumps(ack).encode()))

        ahead = 0  # batches the caller may send before reading an acknowledgement
        try:
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                except (pa.ArrowException, OSError) as exc:  # ArrowIOError is an OSError
                    raise InvalidArgumentError(
                        f"unreadable Arrow stream ({exc}); {total} rows were produced"
                    ) from exc
                if chunk.app_metadata is not None:
                    ahead = _write_ahead(chunk.app_metadata, ahead)
                batch = chunk.data
                if batch is None:  # metadata-only message
                    continue
                size = batch.get_total_buffer_size()
                received += size
                rows = self._rows(plan, batch, size, received, total, traceparent)
                try:
                    acked = asyncio.ensure_future(await out.submit(plan.topic, rows))
                except ThalwegError as exc:
                    raise fl.FlightServerError(
                        f"producing to {plan.topic!r} failed after {total} rows: {exc}"
                    ) from exc
                inflight.append((acked, size))
                while len(inflight) > ahead:
                    await acknowledge()
            while inflight:
                await acknowledge()
        finally:
            for left, _ in inflight:
                left.cancel()
            await out.stop()
        return total

    async def _started(self, plan: PutPlan, source: BrokerSourceConfig) -> TopicProducer:
        out = self.producer_for(source)
        try:
            await out.start()
        except ThalwegError as exc:
            hint = (
                " (gateway.idempotent_producer is on: the broker must support idempotent producers)"
                if self._idempotent
                else ""
            )
            raise fl.FlightServerError(
                f"cannot start a producer for {plan.topic!r}: {exc}{hint}; 0 rows were produced"
            ) from exc
        return out

    def _rows(
        self,
        plan: PutPlan,
        batch: pa.RecordBatch,
        size: int,
        received: int,
        total: int,
        traceparent: bytes | None,
    ) -> ProduceRows:
        """One put batch checked against the limits and made into produce columns."""
        limits = self._limits
        try:
            if size > limits.max_batch_bytes:
                raise TicketError(
                    f"a batch of {size} bytes exceeds gateway.flight.max_batch_bytes "
                    f"({limits.max_batch_bytes}); send smaller batches"
                )
            if received > limits.max_put_bytes:
                raise TicketError(
                    f"this put exceeds gateway.flight.max_put_bytes "
                    f"({limits.max_put_bytes}); split it into several puts"
                )
            batch.validate(full=True)
            rows = plan.rows(batch)
            if traceparent is not None:
                rows = rows.with_header(b"traceparent", traceparent)
        except (pa.ArrowException, TicketError) as exc:
            raise InvalidArgumentError(
                f"invalid batch after row {total} ({exc}); {total} rows were produced"
            ) from exc
        return rows

    def producer_for(self, source: BrokerSourceConfig) -> TopicProducer:
        """A new (not started) producer into ``source``'s cluster."""
        if isinstance(source, PulsarSourceConfig):
            return PulsarTopicProducer(source, self._put_timeout_ms)
        return KafkaTopicProducer(
            KafkaWriter(
                source.bootstrap_servers,
                max_request_size=16 << 20,
                idempotent=self._idempotent,
                compression=source.produce_compression,
                request_timeout_ms=self._put_timeout_ms,
                **security_kwargs(source),
            )
        )

    def source_for(self, topic: str) -> BrokerSourceConfig | None:
        """The source a put to ``topic`` produces through: the one that lists it, else a
        source whose ``topics_pattern`` matches the whole topic name."""
        found = self._sources.get(topic)
        if found is None:
            for pattern, source in self._patterns:
                if pattern.fullmatch(topic):
                    return source
        return found

    def _put_topic(self, descriptor: fl.FlightDescriptor) -> str:
        if descriptor.descriptor_type != fl.DescriptorType.PATH:
            raise TicketError("do_put takes a path descriptor ['topics', <topic>]")
        return path_topic(descriptor)
