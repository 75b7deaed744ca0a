"""Encoders ready to produce into a topic: writer schema registered under its subject."""

from __future__ import annotations

import re

import pyarrow as pa

from thalweg.codecs.encode import AvroEncoder, ProtobufEncoder
from thalweg.codecs.typemap import arrow_schema_to_avro
from thalweg.errors import InvariantError
from thalweg.registry.confluent import ConfluentRegistry, topic_subject
from thalweg.registry.errors import RegistryError


def avro_encoder_for_topic(
    registry: ConfluentRegistry, topic: str, schema: pa.Schema, *, record_name: str | None = None
) -> AvroEncoder:
    """Derive the Avro writer schema of ``schema``, register it under ``<topic>-value``
    (TopicNameStrategy) and return an encoder framing rows with the registered id.

    Registering an identical schema again returns the same id, so this is idempotent.
    """
    name = record_name or (re.sub(r"[^A-Za-z0-9_]", "_", topic).lstrip("0123456789") or "Record")
    avro = arrow_schema_to_avro(schema, name)
    schema_id = registry.register(topic_subject(topic), avro)
    return AvroEncoder(schema_id, avro)


def protobuf_encoder_for_topic(
    topic: str,
    *,
    registry: ConfluentRegistry | None = None,
    descriptor_set: bytes | None = None,
) -> tuple[ProtobufEncoder, pa.Schema]:
    """An encoder for the topic's Protobuf message, and the Arrow schema of its fields.

    The message is the first one of the schema's file (Confluent message index ``[0]``).
    With a registry, the schema is the latest registered under ``<topic>-value`` (the
    producer side never invents a Protobuf schema: it must be registered first); with a
    descriptor set, the set's last file, framed with schema id 0 (a descriptor-set
    source ignores ids).
    """
    from thalweg.codecs.protobuf import ProtoSchema
    from thalweg.registry.protoc import compile_proto

    if descriptor_set is not None:
        schema, schema_id = ProtoSchema(descriptor_set), 0
    else:
        if registry is None:
            raise InvariantError("registry is not set")
        found = registry.latest_raw(topic_subject(topic))
        if found is None:
            raise RegistryError(
                f"no schema registered under {topic_subject(topic)!r}: register the topic's "
                ".proto there before producing Protobuf through the gateway"
            )
        schema_id, kind, text = found
        if kind != "PROTOBUF":
            raise RegistryError(f"the latest {topic_subject(topic)!r} schema is {kind}")
        schema = ProtoSchema(compile_proto(text))
    message_class, arrow = schema.message([0])
    return ProtobufEncoder(schema_id, message_class, [0]), arrow
