"""Binary (protobuf) read tickets, mapped one to one onto the JSON form.

The message definitions come from ``proto/thalweg/flight/v1/ticket.proto``, compiled to
the descriptor set ``ticket_v1.desc`` shipped beside this module (``make proto``). The
classes are built from that descriptor at import, in a private pool, rather than from
checked-in generated code: generated code pins the protobuf runtime to the generator's
version, a descriptor works with every protobuf release since 4.21.

Both directions go through the JSON form, so the server validates one thing: a binary
ticket is decoded into exactly the JSON object that means the same read, and the JSON
rules (required fields, ranges, version) then apply to both. What only the binary form
can get wrong — unknown field numbers, unknown enum numbers, a missing version — is
refused here, naming the field.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

_PACKAGE = "thalweg.flight.v1"


class WireError(ValueError):
    """A ticket that cannot be decoded or encoded; ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"invalid ticket field {field!r}: {message}")
        self.field = field


def _load() -> dict[str, Any]:
    data = resources.files(__package__).joinpath("ticket_v1.desc").read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    names = ("ReadTicket", "Position", "Scalar", "ScalarList", "Condition")
    return {
        n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{n}"))
        for n in names
    }


_CLASSES = _load()
ReadTicketPb: Any = _CLASSES["ReadTicket"]

_LANES = {1: "decoded", 2: "raw", 3: "dlq"}
_POLICIES = {1: "none", 2: "locator", 3: "all"}
_ANCHORS = {1: "earliest", 2: "latest", 3: "now", 4: "follow"}
_VIEWS = {1: "all", 2: "latest"}


def is_json_ticket(data: bytes) -> bool:
    """A ticket whose first non-blank byte is ``{`` is JSON; any other is protobuf.

    Unambiguous: a binary ticket starts with the tag of field 1 (``0x08``), and ``{``
    (``0x7b``) would be the tag of field 15, which the message does not have.
    """
    return data.lstrip(b" \t\r\n")[:1] == b"{"


# -- binary -> JSON form ---------------------------------------------------------------


def decode_ticket(data: bytes) -> dict[str, Any]:
    """The JSON-form object a binary ticket means (only the fields it sets)."""
    try:
        msg = ReadTicketPb.FromString(data)
    except DecodeError as exc:
        raise WireError(
            "ticket", f"neither a JSON object nor a protobuf ReadTicket ({exc})"
        ) from exc
    _refuse_unknown(msg, "ticket")
    if msg.version != 1:
        raise WireError("v", f"a binary ticket must set version (field 1) to 1, not {msg.version}")
    out: dict[str, Any] = {"v": msg.version, "topic": msg.topic}
    if msg.lane:
        out["lane"] = _enum(_LANES, msg.lane, "lane")
    if msg.partitions:
        out["partitions"] = list(msg.partitions)
    for name in ("start", "end"):
        if msg.HasField(name):
            out[name] = _position(getattr(msg, name), name)
    if msg.metadata:
        out["metadata"] = _enum(_POLICIES, msg.metadata, "metadata")
    if msg.columns:
        out["columns"] = list(msg.columns)
    if msg.filter:
        out["filter"] = [_condition(c) for c in msg.filter]
    if msg.HasField("epoch"):
        out["epoch"] = msg.epoch
    if msg.view:
        out["view"] = _enum(_VIEWS, msg.view, "view")
    return out


def _refuse_unknown(msg: Message, where: str) -> None:
    if len(UnknownFieldSet(msg)):
        numbers = sorted({f.field_number for f in UnknownFieldSet(msg)})
        raise WireError(where, f"unknown field number(s) {numbers} (a newer ticket version?)")
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        children = value if _repeated(field) else [value]
        for child in children:
            _refuse_unknown(child, field.name if where == "ticket" else where)


def _repeated(field: Any) -> bool:
    # protobuf >= 6 has ``is_repeated``; older releases only ``label``.
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return bool(field.label == field.LABEL_REPEATED)


def _enum(names: dict[int, str], number: int, field: str) -> str:
    if number not in names:
        raise WireError(field, f"unknown enum number {number}")
    return names[number]


def _position(pos: Any, field: str) -> Any:
    which = pos.WhichOneof("position")
    if which is None:
        raise WireError(field, "a Position must set anchor, offset or timestamp_ms")
    if which == "anchor":
        return _enum(_ANCHORS, pos.anchor, field)
    return {which: getattr(pos, which)}


def _condition(cond: Any) -> dict[str, Any]:
    value = _scalar(cond.value) if cond.HasField("value") else None
    return {"column": cond.column, "op": cond.op, "value": value}


def _scalar(s: Any) -> Any:
    which = s.WhichOneof("value")
    if which is None:
        return None
    if which == "list_value":
        return [_scalar(v) for v in s.list_value.values]
    return getattr(s, which)


# -- JSON form -> binary ---------------------------------------------------------------


def encode_ticket(obj: dict[str, Any]) -> bytes:
    """The binary ticket for a JSON-form object (defaults need not be spelled out).

    Raises :class:`WireError` for fields the binary form has no place for; value checks
    (ranges, which anchors a start may use) are left to the gateway, as for JSON.
    """
    allowed = {
        "v", "topic", "lane", "partitions", "start", "end", "metadata", "columns", "epoch", "view",
    }  # fmt: skip
    unknown = sorted(set(obj) - allowed - {"filter"})
    if unknown:
        raise WireError(unknown[0], "not a ticket field")
    msg = ReadTicketPb(version=int(obj.get("v", 1)), topic=str(obj.get("topic", "")))
    if obj.get("lane") is not None:
        msg.lane = _number(_LANES, obj["lane"], "lane")
    if obj.get("partitions"):
        msg.partitions.extend(int(p) for p in obj["partitions"])
    for name in ("start", "end"):
        if obj.get(name) is not None:
            _set_position(getattr(msg, name), obj[name], name)
    if obj.get("metadata") is not None:
        msg.metadata = _number(_POLICIES, obj["metadata"], "metadata")
    if obj.get("columns"):
        msg.columns.extend(str(c) for c in obj["columns"])
    if obj.get("epoch") is not None:
        msg.epoch = int(obj["epoch"])
    if obj.get("view") is not None:
        msg.view = _number(_VIEWS, obj["view"], "view")
    for cond in obj.get("filter") or []:
        c = msg.filter.add(column=str(cond.get("column", "")), op=str(cond.get("op", "")))
        if cond.get("value") is not None:
            _set_scalar(c.value, cond["value"])
    return bytes(msg.SerializeToString(deterministic=True))


def _number(names: dict[int, str], value: str, field: str) -> int:
    for number, name in names.items():
        if name == value:
            return number
    raise WireError(field, f"unknown value {value!r}")


def _set_position(pos: Any, value: Any, field: str) -> None:
    if isinstance(value, str):
        pos.anchor = _number(_ANCHORS, value, field)
    elif (
        isinstance(value, dict)
        and len(value) == 1
        and next(iter(value))
        in (
            "offset",
            "timestamp_ms",
        )
    ):
        key, number = next(iter(value.items()))
        setattr(pos, key, int(number))
    else:
        raise WireError(field, f"not a position: {value!r}")


def _set_scalar(s: Any, value: Any) -> None:
    if isinstance(value, bool):
        s.bool_value = value
    elif isinstance(value, int):
        s.int_value = value
    elif isinstance(value, float):
        s.double_value = value
    elif isinstance(value, str):
        s.string_value = value
    elif isinstance(value, list):
        s.list_value.SetInParent()
        for v in value:
            _set_scalar(s.list_value.values.add(), v)
    else:
        raise WireError("filter", f"a filter value cannot be {type(value).__name__}")
