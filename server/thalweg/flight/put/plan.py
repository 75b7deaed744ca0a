"""``do_put`` into a topic: which rows become which records, checked before producing.

A put's columns are either

* ``value`` (binary or string) — the payload as is — or
* payload columns, encoded with the topic's format (``json``; ``avro`` through the
  registry, writer schema registered under ``<topic>-value``; ``protobuf`` with the
  message registered under ``<topic>-value`` or the source's descriptor set),

plus, optionally, ``key`` (binary/string), ``headers``
(``list<struct<key, value>>``), ``partition`` (integer) and ``timestamp`` (timestamp or
epoch milliseconds). Anything else about the schema is refused before a row is produced,
and so are payload columns beyond the source's ``schema_limits`` (too many fields, too
deep, a name too long): the decoded lane would refuse every record of such a put.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.codecs.limits import SchemaLimits, check_schema
from thalweg.config.models import BrokerSourceConfig
from thalweg.errors import TicketError
from thalweg.records.rows import HEADER_TYPE, ProduceRows

ENVELOPE = ("key", "headers", "partition", "timestamp")


@dataclass(frozen=True)
class PutPlan:
    """How the batches of one put become records."""

    topic: str
    source: BrokerSourceConfig
    payload_columns: tuple[str, ...]  # empty: a ``value`` column carries the payload
    encode: Callable[[pa.Table], list[bytes]] | None

    def rows(self, batch: pa.RecordBatch) -> ProduceRows:
        """The records of one (already validated) batch, in row order, as columns.

        Converted column by column with Arrow casts, never record by record.
        """
        table = pa.Table.from_batches([batch])
        n = table.num_rows
        if self.encode is not None:
            encoded = self.encode(table.select(list(self.payload_columns)))
            values: pa.Array = pa.array(encoded, pa.binary())
        else:
            values = _binary(table.column("value"))
        keys = (
            _binary(table.column("key"))
            if "key" in table.column_names
            else pa.nulls(n, pa.binary())
        )
        headers = _headers(table.column("headers")) if "headers" in table.column_names else None
        if "partition" in table.column_names:
            col = pc.fill_null(table.column("partition").cast(pa.int64()), -1)
            partitions = col.to_numpy()
        else:
            partitions = np.full(n, -1, np.int64)
        return ProduceRows(keys, values, headers, _timestamps(table, n), partitions)


def plan_put(
    topic: str,
    schema: pa.Schema,
    source: BrokerSourceConfig | None,
    avro_encoder: Callable[[pa.Schema], Callable[[pa.Table], list[bytes]]] | None = None,
    protobuf_encoder: Callable[[], tuple[Any, pa.Schema]] | None = None,
) -> PutPlan:
    """Check a put's schema against the topic; raises :class:`TicketError` saying why."""
    if source is None:
        raise TicketError(
            f"topic {topic!r} is not configured on this gateway; cannot produce to it"
        )
    refuse_unsafe_types(schema)
    _check_envelope(schema)
    if "value" in schema.names:
        t = schema.field("value").type
        if not (
            pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
            or pa.types.is_string(t)
            or pa.types.is_large_string(t)
        ):
            raise TicketError(f"column 'value' must be binary or string, not {t}")
        extra = [n for n in schema.names if n not in ("value", *ENVELOPE)]
        if extra:
            allowed = ", ".join(("value", *ENVELOPE))
            raise TicketError(f"with a 'value' column, {extra[0]!r} has no meaning ({allowed})")
        return PutPlan(topic, source, (), None)
    payload = tuple(n for n in schema.names if n not in ENVELOPE)
    if not payload:
        raise TicketError("a put needs a 'value' column or payload columns to encode")
    payload_schema = pa.schema([schema.field(n) for n in payload])
    limits = SchemaLimits(**source.schema_limits.model_dump())
    why = check_schema(limits, payload_schema)
    if why is not None:
        # The topic's decoded lane would refuse every record of it (schema_limit): a put
        # of 100,000 columns is refused here, before a row is encoded or produced.
        raise TicketError(
            f"the put's payload columns are beyond the topic's schema_limits: {why} "
            f"(sources.schema_limits of source {source.name!r})"
        )
    if source.format == "json":
        from thalweg.codecs.encode import JsonEncoder

        return PutPlan(topic, source, payload, JsonEncoder().encode)
    if source.format == "avro":
        if avro_encoder is None:
            raise TicketError(f"topic {topic!r}: encoding Avro needs a registry url in its source")
        return PutPlan(topic, source, payload, avro_encoder(payload_schema))
    if source.format == "protobuf":
        if protobuf_encoder is None:
            raise TicketError(
                f"topic {topic!r}: encoding Protobuf needs a registry url or a descriptor set"
            )
        encoder, fields = protobuf_encoder()
        unknown = [n for n in payload if fields.get_field_index(n) < 0]
        if unknown:
            raise TicketError(
                f"column {unknown[0]!r} is not a field of the topic's Protobuf message "
                f"(fields: {', '.join(fields.names)})"
            )
        return PutPlan(topic, source, payload, _checked(encoder.encode))
    raise TicketError(
        f"topic {topic!r} has format {source.format!r}: send a 'value' column with the "
        "encoded payloads"
    )


def _checked(encode: Callable[[pa.Table], list[bytes]]) -> Callable[[pa.Table], list[bytes]]:
    """Turn a value the message cannot hold into a TicketError (before producing)."""

    def run(table: pa.Table) -> list[bytes]:
        try:
            return encode(table)
        except (ValueError, TypeError) as exc:  # json_format.ParseError is a ValueError
            raise TicketError(f"a row does not fit the topic's Protobuf message: {exc}") from exc

    return run


def refuse_unsafe_types(schema: pa.Schema) -> None:
    """Refuse extension types at any depth: a put carries data, and an extension type
    (pickled Python ones above all) is code or meaning the gateway will not take on."""

    def check(f: pa.Field, path: str) -> None:
        if isinstance(f.type, pa.BaseExtensionType) or (
            f.metadata and b"ARROW:extension:name" in f.metadata
        ):
            raise TicketError(f"column {path!r}: extension types are not accepted")
        t = f.type
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                check(t.field(i), f"{path}.{t.field(i).name}")
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            check(t.value_field, f"{path}[]")
        elif pa.types.is_map(t):
            check(t.key_field, f"{path}.key")
            check(t.item_field, f"{path}.value")

    for f in schema:
        check(f, f.name)


def _check_envelope(schema: pa.Schema) -> None:
    checks = {
        "key": lambda t: pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_null(t),
        "partition": pa.types.is_integer,
        "timestamp": lambda t: pa.types.is_timestamp(t) or pa.types.is_integer(t),
        "headers": lambda t: (
            pa.types.is_list(t)
            and pa.types.is_struct(t.value_type)
            and {t.value_type.field(i).name for i in range(t.value_type.num_fields)}
            == {"key", "value"}
        ),
    }
    for name, ok in checks.items():
        if name in schema.names and not ok(schema.field(name).type):
            raise TicketError(f"column {name!r} has an unusable type {schema.field(name).type}")


def _headers(col: pa.ChunkedArray) -> pa.ListArray | None:
    """The headers column as :data:`HEADER_TYPE` (string keys and values as UTF-8 bytes,
    a null list as no headers); None when no record has one. A null header key is
    refused: Kafka and Pulsar have no such thing."""
    headers = col.combine_chunks()
    if pa.types.is_null(headers.type):
        return None
    entries = pc.list_flatten(headers)  # null lists contribute nothing
    if not len(entries):
        return None
    keys = pc.struct_field(entries, "key")
    if keys.null_count:
        raise TicketError("a header key is null")
    counts = pc.fill_null(pc.list_value_length(headers), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(headers) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    canonical = pa.StructArray.from_arrays(
        [keys.cast(pa.binary()), pc.struct_field(entries, "value").cast(pa.binary())],
        fields=list(HEADER_TYPE.value_type),
    )
    return pa.ListArray.from_arrays(pa.array(offsets), canonical)


def _binary(col: pa.ChunkedArray) -> pa.Array:
    """A binary, string or null column as one binary array (strings as UTF-8: a
    zero-copy cast)."""
    if pa.types.is_null(col.type):
        return pa.nulls(len(col), pa.binary())
    return col.combine_chunks().cast(pa.binary())


def _timestamps(table: pa.Table, n: int) -> np.ndarray:
    """Epoch milliseconds per row; a missing or null timestamp is the time of the put."""
    now = time.time_ns() // 1_000_000
    if "timestamp" not in table.column_names:
        return np.full(n, now, np.int64)
    col = table.column("timestamp")
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("ms", tz=col.type.tz)).cast(pa.int64())
    return pc.fill_null(col.cast(pa.int64()), now).to_numpy()  # type: ignore[no-any-return]
