"""One source's decoders: one per topic, each behind its guards, and the schema registry
they share with its outage policy.

A topic's decoder is pinned to the schema its decoded lane already has and bounded by
the source's ``schema_limits`` (records that would widen it past them are refused as
``schema_limit``), then wrapped:
the size guard (``max_record_bytes``), the schema gate (``registry_max_wait_s``) and the
data contract (``contract``) — each turns the records it refuses into per-record
failures with a reason, so every refusal reaches the dead-letter lane the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pyarrow as pa

from thalweg.codecs.avro import AvroArrowDecoder
from thalweg.codecs.base import ArrowDecoder
from thalweg.codecs.envelope import DebeziumEnvelope
from thalweg.codecs.framing import peel
from thalweg.codecs.guard import SchemaGate, SizeGuard
from thalweg.codecs.json import JsonArrowDecoder
from thalweg.codecs.limits import SchemaLimits, check_schema
from thalweg.codecs.rows import ArrowRowDecoder
from thalweg.codecs.typemap import json_schema_record
from thalweg.config.models import SourceConfig, TypedSourceConfig
from thalweg.contracts import ContractGuard, DataContract, compile_object, load_contract
from thalweg.errors import ConfigError, InvariantError
from thalweg.lane.layout import LaneLayout
from thalweg.lane.read.reader import LaneReader
from thalweg.ops.health import Health, State
from thalweg.ops.metrics import Metrics
from thalweg.ops.retry import Backoff
from thalweg.records.columns import MetadataColumns
from thalweg.registry import RegistryUnavailableError
from thalweg.registry.factory import open_proto_schemas, open_registry

log = logging.getLogger(__name__)

# Count and wait one retry of a stage (re-raising when the source is stopping).
Retry = Callable[[Backoff, asyncio.Event, Exception, str], Awaitable[None]]


def schema_limits(cfg: SourceConfig) -> SchemaLimits:
    """The source's ``schema_limits`` as the decoders take them."""
    return SchemaLimits(**cfg.schema_limits.model_dump())


class TopicDecoders:
    """The decoders of one source's topics, made on first use.

    Args:
        cfg: the source.
        layout, columns: where the decoded lanes are (to pin each topic's schema).
        metrics, health, component: where registry trouble is reported.
        retry: the runner's retry step, for registry outages.
        backoff: a fresh backoff for one batch's registry waits.
    """

    def __init__(
        self,
        cfg: SourceConfig,
        layout: LaneLayout,
        columns: MetadataColumns,
        metrics: Metrics,
        health: Health,
        component: str,
        retry: Retry,
        backoff: Callable[[], Backoff],
    ) -> None:
        self.cfg = cfg
        self._layout = layout
        self._columns = columns
        self._metrics = metrics
        self._health = health
        self._component = component
        self._retry = retry
        self._backoff = backoff
        self._decoders: dict[str, ArrowDecoder] = {}
        self._registry: Any = None
        if cfg.format == "protobuf":
            self._registry = open_proto_schemas(cfg)
        elif cfg.registry is not None:
            self._registry = open_registry(cfg.registry)
        self._unknown_ids: set[int] = set()
        # Schema ids whose records skip decoding (retry_exhausted) while the registry has
        # been unreachable for longer than registry_max_wait_s; emptied when it answers.
        self._withheld_ids: frozenset[int] = frozenset()
        self._registry_down_since: float | None = None
        self._contract: DataContract | None = None
        if cfg.contract is not None:
            self._contract = load_contract(cfg.contract)

    def topics(self) -> set[str]:
        """Topics with a decoder (a decoded lane)."""
        return set(self._decoders)

    def get(self, topic: str) -> ArrowDecoder | None:
        """The topic's decoder if it has been made."""
        return self._decoders.get(topic)

    def payload_schema(self, topic: str) -> pa.Schema | None:
        decoder = self._decoders.get(topic)
        return decoder.schema if decoder is not None else None

    def for_topic(self, topic: str) -> ArrowDecoder | None:
        """The topic's decoder, made on first use (a pattern subscription finds topics
        as it goes), pinned to the schema its decoded lane already has; None for
        ``format = "none"``."""
        if self.cfg.format == "none":
            return None
        decoder = self._decoders.get(topic)
        if decoder is None:
            pinned = LaneReader(self._layout, self._columns).decoded_schema(topic)
            if pinned is not None:
                keep = [f for f in pinned if not self._columns.is_reserved(f.name)]
                pinned = pa.schema(keep)
            if self.cfg.envelope == "debezium":
                # The format's decoder reads envelopes, whose schema is not the lane's.
                decoder = DebeziumEnvelope(self._decoder(None), pinned, self.cfg.unavailable_value)
            else:
                decoder = self._decoder(pinned)
            if self.cfg.max_record_bytes is not None and not isinstance(
                self.cfg, TypedSourceConfig
            ):
                decoder = SizeGuard(decoder, self.cfg.max_record_bytes)
            if self._registry is not None and self.cfg.registry_max_wait_s is not None:
                why = (
                    f"the schema registry was unreachable for over "
                    f"{self.cfg.registry_max_wait_s:g}s (registry_max_wait_s)"
                )
                decoder = SchemaGate(decoder, lambda: self._withheld_ids, why)
            if self._contract is not None:
                decoder = self._guarded(topic, decoder, self._contract)
            self._decoders[topic] = decoder
        return decoder

    def _guarded(self, topic: str, decoder: ArrowDecoder, contract: DataContract) -> ArrowDecoder:
        """``decoder`` behind the contract object that describes ``topic``."""
        obj = contract.object_for(topic)
        if obj is None:
            log.warning(
                "source %s: contract %s has no object for topic %s; its records are not checked",
                self.cfg.name,
                self.cfg.contract,
                topic,
            )
            return decoder
        compiled = compile_object(obj)
        for item in compiled.unenforced:
            log.warning(
                "source %s, topic %s: contract: not enforced: %s", self.cfg.name, topic, item
            )
        return ContractGuard(decoder, compiled)

    def _decoder(self, pinned: pa.Schema | None) -> ArrowDecoder:
        limits = schema_limits(self.cfg)
        if pinned is not None and (why := check_schema(limits, pinned)) is not None:
            log.warning(
                "source %s: the decoded lane's schema is already beyond schema_limits (%s): "
                "records that add no field still decode, none may widen it further",
                self.cfg.name,
                why,
            )
        if isinstance(self.cfg, TypedSourceConfig):
            return ArrowRowDecoder(self._columns, pinned, limits)
        if self.cfg.format == "avro":
            if self._registry is None:
                raise InvariantError("self._registry is not set")
            return AvroArrowDecoder(self._columns, self._registry, schema=pinned, limits=limits)
        if self.cfg.format == "protobuf":
            from thalweg.codecs.protobuf import ProtobufArrowDecoder  # the protobuf extra

            return ProtobufArrowDecoder(self._columns, self._registry, schema=pinned, limits=limits)
        if self.cfg.json_schema is not None:
            path = self.cfg.json_schema
            try:
                declared = json_schema_record(json.loads(path.read_text("utf-8")))
            except (OSError, ValueError) as exc:
                raise ConfigError(f"source {self.cfg.name!r}: json_schema {path}: {exc}") from exc
            return JsonArrowDecoder(self._columns, declared, declared=True, limits=limits)
        return JsonArrowDecoder(self._columns, pinned, limits=limits)

    async def resolve(self, raw: pa.RecordBatch, stop: asyncio.Event) -> None:
        """Fetch writer schemas this batch needs before decoding it.

        A registry that cannot answer is retried with backoff: its records wait
        (fetching stops with them). By default for as long as it takes; with
        ``registry_max_wait_s``, once the registry has been unreachable that long, the
        ids still missing are withheld from the decoder — their records go to the
        dead-letter lane as ``retry_exhausted`` and the stream moves on — and each later
        batch tries the registry once before withholding again. An id the registry does
        not know (404) is left to the decoder: a per-record failure.
        """
        registry = self._registry
        if registry is None:
            return
        ids = np.unique(peel(raw.column(self._columns.value)).ids)
        backoff = self._backoff()
        bound = self.cfg.registry_max_wait_s
        withheld: set[int] = set()
        for schema_id in (int(i) for i in ids if i >= 0):
            if schema_id in self._unknown_ids or registry.get(schema_id) is not None:
                continue
            while True:
                try:
                    found = await asyncio.to_thread(registry.fetch, schema_id)
                    self._registry_down_since = None
                    break
                except RegistryUnavailableError as exc:
                    self._metrics.registry_errors.labels(self.cfg.name).inc()
                    self._health.set(self._component, State.DEGRADED, str(exc))
                    now = time.monotonic()
                    if self._registry_down_since is None:
                        self._registry_down_since = now
                    if bound is not None and now - self._registry_down_since >= bound:
                        withheld.add(schema_id)
                        self._metrics.retries_exhausted.labels("registry").inc()
                        found = False
                        break
                    await self._retry(backoff, stop, exc, "registry")
            if found is None:
                self._unknown_ids.add(schema_id)
            if not withheld:
                self._health.set(self._component, State.UP, "connected")
        self._withheld_ids = frozenset(withheld)
