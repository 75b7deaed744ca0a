"""The golden binary vectors against the client's ticket codec (no server code).

The server side of the same files is ``test_ticket_vectors.py``; together they show that
a ticket the client encodes is the ticket the server reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from thalweg_client import ticket as make_ticket
from thalweg_client.wire import WireError, decode_ticket, encode_ticket, is_json_ticket

VECTORS = Path(__file__).resolve().parents[3] / "flight-tickets" / "vectors"
BINARY = json.loads((VECTORS / "binary.json").read_text())
DEFAULTS = {
    "v": 1,
    "lane": "decoded",
    "partitions": None,
    "start": "earliest",
    "end": "now",
    "metadata": "locator",
    "columns": None,
    "filter": None,
    "epoch": None,
    "sink": None,  # JSON tickets only (a sink's dead letters): no binary field
    "view": "all",
}


@pytest.mark.parametrize("case", BINARY["valid"], ids=lambda c: c["hex"][:40])
def test_client_encodes_and_decodes_the_golden_bytes(case: dict[str, Any]) -> None:
    assert encode_ticket(case["ticket"]).hex() == case["hex"]
    decoded = decode_ticket(bytes.fromhex(case["hex"]))
    assert {**DEFAULTS, **decoded} == case["means"]
    assert not is_json_ticket(bytes.fromhex(case["hex"]))


@pytest.mark.parametrize(
    "case",
    [
        c
        for c in BINARY["invalid"]
        if c["field"] in ("ticket", "v", "lane", "metadata", "start")
        and c["why"] != "start anchor follow"
    ],
    ids=lambda c: c["why"],
)
def test_client_refuses_what_only_the_binary_form_can_get_wrong(case: dict[str, Any]) -> None:
    with pytest.raises(WireError) as info:
        decode_ticket(bytes.fromhex(case["hex"]))
    assert info.value.field == case["field"]


def test_the_client_ticket_helper_round_trips_through_binary() -> None:
    t = make_ticket(
        "orders",
        lane="raw",
        partitions=[1],
        start={"timestamp_ms": 5},
        end="follow",
        columns=["a"],
        filter=[{"column": "a", "op": "in", "value": [1, 2]}],
    )
    assert decode_ticket(encode_ticket(t)) == {"v": 1, **t}


def test_fields_without_a_binary_place_are_refused() -> None:
    with pytest.raises(WireError, match="colour"):
        encode_ticket({"topic": "o", "colour": "blue"})
