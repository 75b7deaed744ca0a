"""The golden ticket vectors in ``flight-tickets/`` against the server's parser.

The same files are read by ``test_client_ticket_vectors.py`` against the client's codec,
so server and client are held to one contract.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.helpers import compiled_descriptor
from thalweg.errors import TicketError
from thalweg.flight.read.tickets import ReadTicket, parse_ticket

ROOT = Path(__file__).resolve().parents[3]
TICKETS = ROOT / "flight-tickets"
VECTORS = TICKETS / "vectors"
BINARY = json.loads((VECTORS / "binary.json").read_text())


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


@pytest.mark.parametrize("case", BINARY["valid"], ids=lambda c: c["hex"][:40])
def test_binary_vectors_mean_the_same_as_their_json_twin(case: dict[str, Any]) -> None:
    ticket = parse_ticket(bytes.fromhex(case["hex"]))
    assert ticket.model_dump(mode="json") == case["means"]
    assert ticket == parse_ticket(json.dumps(case["ticket"]).encode())


@pytest.mark.parametrize("case", BINARY["invalid"], ids=lambda c: c["why"])
def test_invalid_binary_vectors_are_refused_naming_the_field(case: dict[str, Any]) -> None:
    with pytest.raises(TicketError) as info:
        parse_ticket(bytes.fromhex(case["hex"]))
    assert f"'{case['field']}'" in str(info.value)


def test_every_valid_json_vector_has_a_binary_twin() -> None:
    assert [c["ticket"] for c in BINARY["valid"]] == [c["ticket"] for c in load("valid.json")]


def test_the_published_json_schema_is_the_servers() -> None:
    published = json.loads((TICKETS / "ticket.schema.json").read_text())
    generated = ReadTicket.model_json_schema()
    assert {k: v for k, v in published.items() if not k.startswith("$schema")} == {
        "$id": published["$id"],
        **generated,
    }


def test_the_json_schema_agrees_with_the_vectors() -> None:
    schema = json.loads((TICKETS / "ticket.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for case in load("valid.json"):
        assert not list(validator.iter_errors(case["ticket"])), case
    for case in load("invalid.json"):
        assert list(validator.iter_errors(case["ticket"])), case


def test_the_shipped_descriptor_set_is_compiled_from_the_proto(tmp_path: Path) -> None:
    compiled = compiled_descriptor("thalweg/flight/v1/ticket.proto", tmp_path / "t.desc")
    shipped = ROOT / "client/thalweg_client/wire/ticket_v1.desc"
    assert compiled == shipped.read_bytes(), "run `make proto`"
