"""The payload encoders a put may need, built from the topic's source.

An Avro put registers its writer schema under ``<topic>-value``; a Protobuf put encodes
with the message registered there or found in the source's descriptor set. Both are
made lazily, once the put's schema is known, so a put of a ``value`` column never
contacts a registry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from thalweg.config.models import BrokerSourceConfig
from thalweg.errors import InvariantError, TicketError
from thalweg.registry.confluent import ConfluentRegistry
from thalweg.registry.encoding import avro_encoder_for_topic, protobuf_encoder_for_topic
from thalweg.registry.factory import open_registry

AvroEncoderFactory = Callable[[pa.Schema], Callable[[pa.Table], list[bytes]]]
ProtobufEncoderFactory = Callable[[], tuple[Any, pa.Schema]]


def avro_encoder(topic: str, source: BrokerSourceConfig | None) -> AvroEncoderFactory | None:
    """Makes the Avro encoder of a put's payload schema; None without a registry url."""
    if source is None or source.registry is None or source.registry.url is None:
        return None
    registry = open_registry(source.registry)
    if not isinstance(registry, ConfluentRegistry):
        raise InvariantError("registry is not a ConfluentRegistry")

    def make(schema: pa.Schema) -> Callable[[pa.Table], list[bytes]]:
        return avro_encoder_for_topic(registry, topic, schema).encode

    return make


def protobuf_encoder(
    topic: str, source: BrokerSourceConfig | None
) -> ProtobufEncoderFactory | None:
    """Makes the topic's Protobuf encoder and its fields; None unless the source is
    Protobuf."""
    if source is None or source.format != "protobuf":
        return None
    descriptor_path = source.protobuf_descriptor_set

    def make() -> tuple[Any, pa.Schema]:
        if descriptor_path is not None:
            return protobuf_encoder_for_topic(topic, descriptor_set=descriptor_path.read_bytes())
        if source.registry is None or source.registry.url is None:
            raise TicketError(f"topic {topic!r}: Protobuf puts need a registry url")
        registry = open_registry(source.registry)
        if not isinstance(registry, ConfluentRegistry):
            raise InvariantError("registry is not a ConfluentRegistry")
        return protobuf_encoder_for_topic(topic, registry=registry)

    return make
