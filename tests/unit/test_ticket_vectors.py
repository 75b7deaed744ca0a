"""The golden ticket vectors in ``flight-tickets/vectors`` against the server's parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from thalweg.errors import TicketError
from thalweg.flight.tickets import parse_ticket

VECTORS = Path(__file__).resolve().parents[2] / "flight-tickets" / "vectors"


def load(name: str) -> list[dict[str, Any]]:
    return list(json.loads((VECTORS / name).read_text()))


@pytest.mark.parametrize("case", load("valid.json"), ids=lambda c: json.dumps(c["ticket"]))
def test_valid_vectors_mean_what_they_say(case: dict[str, Any]) -> None:
    ticket = parse_ticket(json.dumps(case["ticket"]).encode())
    assert ticket.model_dump(mode="json") == case["means"]
    # The canonical form reads back to the same ticket.
    assert parse_ticket(ticket.to_bytes()) == ticket


@pytest.mark.parametrize("case", load("invalid.json"), ids=lambda c: json.dumps(c["ticket"]))
def test_invalid_vectors_are_refused_naming_the_field(case: dict[str, Any]) -> None:
    with pytest.raises(TicketError) as info:
        parse_ticket(json.dumps(case["ticket"]).encode())
    assert f"'{case['field']}'" in str(info.value)
