"""The configuration schema: its root, and the one import of every section.

Models are frozen and refuse unknown keys, so a typo is an error at start, not a
silently ignored setting. ``docs/configuration.md`` mirrors this file.

The sections live beside it — ``flight`` (the Flight server), ``gateway`` (the service
and its raw lane), ``sources``, ``sinks``, ``pipeline``, ``retention`` — and this module
holds the document's root, ``ThalwegConfig``, with the rules that span sections, and
re-exports every section's models so ``thalweg.config.models`` stays the one import.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from thalweg.config.common import _Model, secret_paths
from thalweg.config.flight import (
    FlightAuthConfig,
    FlightServingConfig,
    FlightSqlConfig,
    FlightTlsConfig,
    FlightToken,
    FlightUser,
)
from thalweg.config.gateway import (
    GatewayConfig,
    ObjectStoreConfig,
    RawLaneConfig,
    TracingConfig,
)
from thalweg.config.pipeline import PipelineConfig, root_topic
from thalweg.config.retention import CompactionConfig, RetentionConfig
from thalweg.config.sinks import (
    RecoveryConfig,
    SinkConfig,
)
from thalweg.config.sources import (
    ArrowIpcSourceConfig,
    BrokerSourceConfig,
    FilesSourceConfig,
    FlightSourceConfig,
    KafkaSourceConfig,
    PulsarSourceConfig,
    RegistryConfig,
    SchemaLimitsConfig,
    SourceConfig,
    TypedSourceConfig,
)

__all__ = [
    "ArrowIpcSourceConfig",
    "BrokerSourceConfig",
    "FilesSourceConfig",
    "FlightAuthConfig",
    "FlightServingConfig",
    "FlightSourceConfig",
    "FlightSqlConfig",
    "FlightTlsConfig",
    "FlightToken",
    "FlightUser",
    "GatewayConfig",
    "KafkaSourceConfig",
    "ObjectStoreConfig",
    "PulsarSourceConfig",
    "RawLaneConfig",
    "RegistryConfig",
    "SchemaLimitsConfig",
    "SourceConfig",
    "ThalwegConfig",
    "TracingConfig",
    "TypedSourceConfig",
]


class ThalwegConfig(_Model):
    """The whole file."""

    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    raw_lane: RawLaneConfig = Field(default_factory=RawLaneConfig)
    sources: list[SourceConfig] = Field(min_length=1)
    sinks: list[SinkConfig] = Field(default_factory=list)
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)

    @model_validator(mode="after")
    def _pipeline(self) -> ThalwegConfig:
        """Every node reads a consumed topic or a node — a topic with a decoded lane —
        and feeds a configured sink."""
        source_of = self.source_of
        nodes = {n.name: n for n in self.pipeline.nodes}
        sinks = {s.name for s in self.sinks}
        for node in self.pipeline.nodes:
            where = f"pipeline.nodes.{node.name}"
            if source_of(node.name) is not None:
                raise ValueError(f"{where}: a node cannot share a topic's name")
            if node.from_ not in nodes and source_of(node.from_) is None:
                raise ValueError(
                    f"{where}: from = {node.from_!r} is neither a consumed topic nor a node"
                )
            if node.sink is not None and node.sink not in sinks:
                raise ValueError(f"{where}: sink = {node.sink!r} is not a [[sinks]] name")
            root = root_topic(nodes, node.from_)
            source = source_of(root)
            if source is not None and source.format == "none":
                raise ValueError(
                    f"{where}: topic {root!r} has no decoded lane (its source has format = "
                    '"none"); nodes transform decoded records'
                )
        fed: dict[str, str] = {}
        by_name = nodes
        for node in self.pipeline.nodes:
            if node.sink is None:
                continue
            where = f"pipeline.nodes.{node.name}"
            if node.sink in fed:
                raise ValueError(
                    f"{where}: sink {node.sink!r} is already fed by node {fed[node.sink]!r}"
                )
            fed[node.sink] = node.name
            root = root_topic(by_name, node.from_)
            sink = next(s for s in self.sinks if s.name == node.sink)
            if sink.topics != [root]:
                raise ValueError(
                    f"{where}: sink {node.sink!r} must have topics = [{root!r}], the topic "
                    "the node derives from (its positions are that topic's)"
                )
            if sink.raw:
                raise ValueError(f"{where}: a node's sink receives derived rows, not raw = true")
        return self

    @model_validator(mode="after")
    def _sinks(self) -> ThalwegConfig:
        """A sink needs recovery, a lane to read, and a unique name."""
        names = [s.name for s in self.sinks]
        if len(set(names)) != len(names):
            raise ValueError("sinks: two sinks share a name")
        if self.sinks and not self.recovery.enabled:
            raise ValueError(
                "sinks: a secondary sink needs recovery (recovery.enabled = true): without "
                "the replay from the raw lane, a sink that is down loses what it missed"
            )
        for sink in self.sinks:
            for topic in sink.topics:
                source = self.source_of(topic)
                if source is None:
                    raise ValueError(
                        f"sinks.{sink.name}: topic {topic!r} is not consumed by any source"
                    )
                if source is not None and source.format == "none" and not sink.raw:
                    raise ValueError(
                        f"sinks.{sink.name}: topic {topic!r} has no decoded lane (its source "
                        'has format = "none"); set raw = true to send the raw lane'
                    )
        return self

    @model_validator(mode="after")
    def _unique(self) -> ThalwegConfig:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError("sources: two sources share a name")
        seen: dict[str, str] = {}
        for source in self.sources:
            for topic in source.topics:
                if topic in seen:
                    raise ValueError(
                        f"sources: topic {topic!r} is consumed by both {seen[topic]!r} and "
                        f"{source.name!r}; one lane per topic name"
                    )
                seen[topic] = source.name
        return self

    def source_of(self, topic: str) -> SourceConfig | None:
        """The source consuming ``topic``: one naming it, or a Pulsar source whose
        ``topics_pattern`` matches the whole name."""
        for s in self.sources:
            if topic in s.topics:
                return s
        for s in self.sources:
            if s.takes(topic):
                return s
        return None

    def broker_sources(self) -> list[BrokerSourceConfig]:
        """The sources a broker holds the topics of (Kafka, Pulsar): ``do_put`` can
        produce to their topics."""
        return [s for s in self.sources if isinstance(s, (KafkaSourceConfig, PulsarSourceConfig))]

    def secrets(self) -> list[str]:
        """Dotted paths of every configured secret (values never shown)."""
        return secret_paths(self)
