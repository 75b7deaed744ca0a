"""Flight tickets and read commands: a typed, versioned model of what a reader asks for.

A ticket arrives as a JSON object (any language can write one by hand) or as the
protobuf ``thalweg.flight.v1.ReadTicket`` (``proto/``); the binary form is decoded into
the JSON object that means the same read, so one set of rules validates both. Unknown
fields and versions are refused rather than ignored, so a client never silently gets
something it did not ask for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from thalweg.errors import TicketError
from thalweg.lane.layout import Lane
from thalweg.records.columns import MetadataPolicy
from thalweg_client.wire import WireError, decode_ticket, is_json_ticket

TICKET_VERSION = 1

# Caps on what one ticket may ask for, so a ticket costs the gateway little to refuse.
MAX_TICKET_BYTES = 1 << 20
MAX_FILTER_CONDITIONS = 64
MAX_IN_VALUES = 10_000


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OffsetPosition(_Model):
    """An absolute offset. As a start it is inclusive, as an end exclusive."""

    offset: int = Field(ge=0)


class TimestampPosition(_Model):
    """The first record whose timestamp is at or after ``timestamp_ms`` (epoch ms)."""

    timestamp_ms: int


class Condition(_Model):
    """One row condition; a ticket's ``filter`` is the AND of its conditions."""

    column: str = Field(min_length=1)
    op: Literal["==", "!=", "<", "<=", ">", ">=", "in", "is_null", "is_valid"]
    value: Any = None

    @model_validator(mode="after")
    def _bounded(self) -> Condition:
        if isinstance(self.value, list) and len(self.value) > MAX_IN_VALUES:
            raise ValueError(f"an 'in' list holds at most {MAX_IN_VALUES} values")
        return self


Start = Literal["earliest", "latest"] | OffsetPosition | TimestampPosition
End = Literal["now", "follow"] | OffsetPosition | TimestampPosition


class ReadTicket(_Model):
    """One read of a topic's lane.

    Attributes:
        topic: the topic to read.
        lane: ``decoded`` payload columns, or the ``raw`` lane (bytes + all metadata).
        partitions: a subset of partitions; all when omitted.
        start: ``earliest`` | ``latest`` | ``{"offset": N}`` | ``{"timestamp_ms": N}``.
        end: ``now`` (the durable end when the call starts) | ``follow`` (until cancelled)
            | ``{"offset": N}`` (exclusive) | ``{"timestamp_ms": N}``.
        metadata: for the decoded lane, which metadata columns to include.
    """

    v: Annotated[int, Field(ge=TICKET_VERSION, le=TICKET_VERSION)] = TICKET_VERSION
    topic: str = Field(min_length=1)
    lane: Lane = Lane.DECODED
    partitions: list[Annotated[int, Field(ge=0)]] | None = Field(None, min_length=1)
    start: Start = "earliest"
    end: End = "now"
    metadata: MetadataPolicy = MetadataPolicy.LOCATOR
    columns: list[str] | None = Field(
        None, min_length=1, description="Output columns to keep, in this order (all: omit)."
    )
    filter: list[Condition] | None = Field(
        None,
        min_length=1,
        max_length=MAX_FILTER_CONDITIONS,
        description="Rows where all conditions hold.",
    )
    epoch: int | None = Field(
        None,
        ge=0,
        description="A closed epoch of the lane (docs/lanes.md); the current one: omit.",
    )
    sink: str | None = Field(
        None,
        min_length=1,
        description="With lane 'dlq': the records this sink's destination refused "
        "(docs/sinks.md); the topic's decode failures: omit.",
    )
    view: Literal["all", "latest"] = Field(
        "all",
        description="'latest': one row per record key, the newest by position, deleted "
        "keys absent (docs/cdc.md); 'all': every record.",
    )

    @model_validator(mode="after")
    def _start_not_after_end(self) -> ReadTicket:
        if self.sink is not None and self.lane is not Lane.DLQ:
            raise ValueError("'sink' names a sink's dead letters: it needs lane 'dlq'")
        if self.view == "latest" and self.lane is not Lane.DECODED:
            raise ValueError("view 'latest' folds the decoded lane: lane must be 'decoded'")
        if self.view == "latest" and self.end == "follow":
            raise ValueError("view 'latest' is a table as of its end: end 'follow' cannot be one")
        if self.view == "latest" and self.filter is not None:
            raise ValueError("view 'latest' takes no filter yet: filter the rows it returns")
        if self.epoch is not None and self.end == "follow":
            raise ValueError("a closed epoch does not grow: end 'follow' cannot read one")
        s, e = self.start, self.end
        if isinstance(s, OffsetPosition) and isinstance(e, OffsetPosition) and s.offset > e.offset:
            raise ValueError(f"start {{offset: {s.offset}}} is after end {{offset: {e.offset}}}")
        if (
            isinstance(s, TimestampPosition)
            and isinstance(e, TimestampPosition)
            and s.timestamp_ms > e.timestamp_ms
        ):
            raise ValueError(
                f"start {{timestamp_ms: {s.timestamp_ms}}} is after end "
                f"{{timestamp_ms: {e.timestamp_ms}}}"
            )
        return self

    def to_bytes(self) -> bytes:
        return self.model_dump_json(exclude_defaults=False).encode()


@dataclass(frozen=True, slots=True)
class TicketBody:
    """A ticket decoded once, before anyone reads it: its fields, and whether it came as
    JSON (only a JSON ticket can name a pipeline node)."""

    fields: Any
    json: bool


def ticket_body(data: bytes) -> TicketBody:
    """Decode a JSON or binary ticket — the one parse of a ticket's bytes; raises
    :class:`TicketError` for a ticket over :data:`MAX_TICKET_BYTES`, JSON nested too deep
    to parse, or bytes that are neither."""
    if len(data) > MAX_TICKET_BYTES:
        raise TicketError(
            f"ticket is {len(data)} bytes; tickets are limited to {MAX_TICKET_BYTES} bytes"
        )
    if not is_json_ticket(data):
        try:
            return TicketBody(decode_ticket(data), json=False)
        except WireError as exc:
            raise TicketError(str(exc)) from exc
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TicketError(f"ticket is not a JSON object: {exc}") from exc
    except RecursionError as exc:
        raise TicketError("ticket JSON is nested too deeply") from exc
    if not isinstance(obj, dict):
        raise TicketError("ticket is not a JSON object")
    return TicketBody(obj, json=True)


def parse_ticket(data: bytes) -> ReadTicket:
    """Parse a JSON or binary ticket; raises :class:`TicketError` saying exactly what is
    wrong, naming the field."""
    return read_ticket(ticket_body(data))


def read_ticket(body: TicketBody) -> ReadTicket:
    """The lane read a decoded ticket asks for; raises :class:`TicketError` naming the
    field that is wrong."""
    obj = body.fields
    try:
        return ReadTicket.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        if not first["loc"]:  # a rule across fields: the message names them
            why = first["msg"].removeprefix("Value error, ")
            raise TicketError(f"invalid ticket: {why}") from exc
        loc = str(first["loc"][0])
        hint = {
            "start": "earliest | latest | {offset: N} | {timestamp_ms: N}",
            "end": "now | follow | {offset: N} | {timestamp_ms: N}",
            "lane": "decoded | raw",
            "metadata": "none | locator | all",
            "v": f"supported ticket version is {TICKET_VERSION}",
            "filter": '[{"column": c, "op": "==|!=|<|<=|>|>=|in|is_null|is_valid", "value": v}]',
        }.get(loc, "")
        more = f" (expected {hint})" if hint else ""
        raise TicketError(f"invalid ticket field {loc!r}: {first['msg']}{more}") from exc
