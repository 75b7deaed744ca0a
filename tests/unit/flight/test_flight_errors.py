"""flight/errors.py: what a client is told about each kind of failure, and the traceback
hook that touches refusals only."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from thalweg.errors import LaneError, TicketError
from thalweg.flight import errors
from thalweg.flight.errors import (
    InternalError,
    InvalidArgumentError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
    clean,
    install,
    refusal,
    refusals,
)


def test_ticket_errors_are_invalid_argument_with_their_message() -> None:
    told = refusal(TicketError("unknown topic 'x'"), "do_get")
    assert isinstance(told, InvalidArgumentError) and isinstance(told, pa.ArrowInvalid)
    assert str(told) == "unknown topic 'x'"


@pytest.mark.parametrize(
    ("raised", "kind"),
    [
        (fl.FlightUnauthenticatedError("no token"), UnauthenticatedError),
        (fl.FlightUnauthorizedError("not allowed"), PermissionDeniedError),
        (fl.FlightUnavailableError("too many open streams"), UnavailableError),
    ],
)
def test_flight_errors_keep_their_status(raised: Exception, kind: type[Exception]) -> None:
    told = refusal(raised, "do_get")
    assert type(told) is kind and isinstance(told, type(raised))
    assert str(told) == str(raised)


def test_a_fault_is_logged_and_told_without_its_text(caplog: pytest.LogCaptureFixture) -> None:
    leaky = FileNotFoundError(2, "No such file or directory", "/srv/thalweg/raw/x.parquet")
    with caplog.at_level(logging.ERROR, logger="thalweg.flight.errors"):
        told = refusal(leaky, "do_get")
    assert isinstance(told, InternalError)
    assert "/srv" not in str(told) and "incident" in str(told)
    incident = str(told).split("incident ")[1].split(",")[0]
    assert incident in caplog.text and caplog.records[0].exc_info is not None
    assert isinstance(refusal(LaneError("/srv/x: disk full"), "do_get"), UnavailableError)


def test_clean_drops_a_traceback_and_caps_the_length() -> None:
    wrapped = 'bad. Detail: Python exception: Traceback (most recent call last):\n  File "/a.py"'
    assert clean(wrapped) == "bad"
    assert clean("x\nTraceback (most recent call last):\n  File") == "x"
    assert len(clean("y" * 5000)) == errors.MAX_MESSAGE_CHARS
    told = refusal(InvalidArgumentError(wrapped), "do_get")
    assert str(told) == "bad" and isinstance(told, InvalidArgumentError)


def test_the_hook_renders_refusals_only() -> None:
    install()
    install()  # idempotent: one wrapper, not a chain of them
    assert traceback.format_exception.__wrapped__ is not traceback.format_exception  # type: ignore[attr-defined]
    assert not getattr(traceback.format_exception.__wrapped__, "_thalweg_refusals", False)  # type: ignore[attr-defined]

    def raise_(exc: Exception) -> Exception:
        try:
            raise exc
        except Exception as caught:
            return caught

    refused = raise_(InvalidArgumentError("bad ticket"))
    assert traceback.format_exception(type(refused), refused, refused.__traceback__) == [
        "INVALID_ARGUMENT"
    ]
    other = raise_(ValueError("a bug"))
    text = "".join(traceback.format_exception(type(other), other, other.__traceback__))
    assert text.startswith("Traceback (most recent call last)") and "ValueError: a bug" in text
    assert "".join(traceback.format_exception(other)) == text  # the one-argument form


def test_refusals_covers_what_a_handler_returns_to_iterate() -> None:
    class Handlers:
        @refusals
        def do_action(self) -> Iterator[bytes]:
            yield b"first"
            raise TicketError("unknown action 'x'")

        @refusals
        def get_schema(self) -> None:
            raise KeyError("/srv/secret")

    items = Handlers().do_action()
    assert next(items) == b"first"
    with pytest.raises(InvalidArgumentError, match="unknown action"):
        next(items)
    with pytest.raises(InternalError, match="get_schema failed inside the gateway"):
        Handlers().get_schema()
