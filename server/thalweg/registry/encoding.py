"""Encoders ready to produce into a topic: writer schema registered under its subject."""

from __future__ import annotations

import re

import pyarrow as pa

from thalweg.codecs.encode import AvroEncoder
from thalweg.codecs.typemap import arrow_schema_to_avro
from thalweg.registry.confluent import ConfluentRegistry, topic_subject


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
