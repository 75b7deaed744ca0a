"""Flight tickets: the JSON form, defaults, and errors that say what is wrong."""

from __future__ import annotations

import json

import pytest

from thalweg.errors import TicketError
from thalweg.flight.read.tickets import OffsetPosition, TimestampPosition, parse_ticket


def test_full_ticket() -> None:
    t = parse_ticket(
        json.dumps(
            {
                "topic": "orders",
                "lane": "decoded",
                "partitions": [0, 2],
                "start": "earliest",
                "end": "now",
                "metadata": "locator",
            }
        ).encode()
    )
    assert t.partitions == [0, 2] and t.start == "earliest" and t.end == "now"


def test_defaults_and_positions() -> None:
    t = parse_ticket(b'{"topic": "o", "start": {"offset": 5}, "end": {"timestamp_ms": 9}}')
    assert t.lane.value == "decoded" and t.metadata.value == "locator"
    assert t.start == OffsetPosition(offset=5) and t.end == TimestampPosition(timestamp_ms=9)
    assert parse_ticket(t.to_bytes()) == t


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"\xff", "neither a JSON object nor a protobuf"),
        (b"3", "neither a JSON object nor a protobuf"),
        (b"[1]", "neither a JSON object nor a protobuf"),
        (b" [1]", "neither a JSON object nor a protobuf"),
        (b"{[1]", "not a JSON object"),
        (b"{}", "'topic'"),
        (b'{"topic": "o", "lane": "x"}', "decoded | raw"),
        (b'{"topic": "o", "start": {"offset": -1}}', "start"),
        (b'{"topic": "o", "end": "later"}', "now | follow"),
        (b'{"topic": "o", "partitions": [-1]}', "partitions"),
        (b'{"topic": "o", "extra": 1}', "extra"),
        (b'{"topic": "o", "v": 9}', "version"),
    ],
)
def test_invalid_tickets(body: bytes, needle: str) -> None:
    with pytest.raises(TicketError, match=needle.replace("|", r"\|")):
        parse_ticket(body)


def test_a_closed_epoch_is_read_to_its_end_never_followed() -> None:
    ticket = parse_ticket(b'{"topic": "o", "epoch": 2}')
    assert ticket.epoch == 2 and parse_ticket(ticket.to_bytes()) == ticket
    assert parse_ticket(b'{"topic": "o"}').epoch is None
    with pytest.raises(TicketError, match="closed epoch does not grow"):
        parse_ticket(b'{"topic": "o", "epoch": 0, "end": "follow"}')


def test_a_sinks_dead_letters_are_read_from_the_dlq_lane() -> None:
    ticket = parse_ticket(b'{"topic": "orders", "lane": "dlq", "sink": "db"}')
    assert ticket.sink == "db"
    with pytest.raises(TicketError, match="'sink' names a sink's dead letters: it needs lane"):
        parse_ticket(b'{"topic": "orders", "sink": "db"}')
