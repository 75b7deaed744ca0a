"""The Flight SQL messages, from the descriptor set compiled out of ``proto/``.

A Flight SQL client packs every command, ticket and action body in a
``google.protobuf.Any`` whose type URL names the message. The classes are built from
``flight_sql.desc`` (``make proto``) in a private descriptor pool, as the ticket
contract's are (``thalweg_client.wire``): no generated code, so any protobuf runtime
since 4.21 works.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

PACKAGE = "arrow.flight.protocol.sql"
TYPE_PREFIX = f"type.googleapis.com/{PACKAGE}."
# An Any starts with field 1 (the type URL): tag 0x0a, a one-byte length (the prefix
# and a message name are shorter than 128 bytes), then the URL.
_WIRE_PREFIX = TYPE_PREFIX.encode()

_NAMES = (
    "CommandGetSqlInfo",
    "CommandGetXdbcTypeInfo",
    "CommandGetCatalogs",
    "CommandGetDbSchemas",
    "CommandGetTables",
    "CommandGetTableTypes",
    "CommandGetPrimaryKeys",
    "CommandGetExportedKeys",
    "CommandGetImportedKeys",
    "CommandGetCrossReference",
    "CommandStatementQuery",
    "CommandStatementSubstraitPlan",
    "TicketStatementQuery",
    "CommandPreparedStatementQuery",
    "CommandStatementUpdate",
    "CommandPreparedStatementUpdate",
    "DoPutUpdateResult",
    "DoPutPreparedStatementResult",
    "CommandStatementIngest",
    "ActionCreatePreparedStatementRequest",
    "ActionCreatePreparedStatementResult",
    "ActionClosePreparedStatementRequest",
)


def _load() -> dict[str, Any]:
    data = resources.files(__package__).joinpath("flight_sql.desc").read_bytes()
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.Add(f)
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{n}"))
        for n in _NAMES
    }


M: dict[str, Any] = _load()
"""Message classes by their protocol name, e.g. ``M["CommandStatementQuery"]``."""


def is_sql(data: bytes) -> bool:
    """Whether ``data`` is an ``Any`` holding a Flight SQL message (a descriptor command,
    ticket or action body); JSON and binary read tickets never start like one."""
    return len(data) > 2 and data[0] == 0x0A and data[2:].startswith(_WIRE_PREFIX)


def unpack(data: bytes) -> tuple[str, Message]:
    """The message name and the message of an ``Any``-packed Flight SQL body.

    Raises:
        ValueError: not an ``Any``, not a Flight SQL message, one the gateway does not
            know, or bytes that do not parse as the message it names.
    """
    try:
        packed = any_pb2.Any.FromString(data)
    except DecodeError as exc:
        raise ValueError(f"not a Flight SQL command: {exc}") from exc
    if not packed.type_url.startswith(TYPE_PREFIX):
        raise ValueError(f"not a Flight SQL command: type {packed.type_url!r}")
    name = packed.type_url[len(TYPE_PREFIX) :]
    cls = M.get(name)
    if cls is None:
        raise LookupError(name)
    try:
        return name, cls.FromString(packed.value)
    except DecodeError as exc:
        raise ValueError(f"malformed {name}: {exc}") from exc


def pack(message: Message) -> bytes:
    """``message`` in an ``Any``, as Flight SQL sends results and tickets."""
    packed = any_pb2.Any()
    packed.Pack(message, type_url_prefix="type.googleapis.com/")
    return bytes(packed.SerializeToString())
