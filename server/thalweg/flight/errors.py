"""What a Flight client is told when a call fails: the message and a status code, never a
Python traceback or a path on the gateway.

How pyarrow (26) sends an exception raised in a handler:

* the ``pyarrow.flight.Flight*Error`` classes travel clean (``"message. Detail:
  Unavailable"``), but none of them means ``INVALID_ARGUMENT``, and ``get_schema`` does
  not catch them (there they arrive as ``UNKNOWN``);
* every other exception is mapped by its Python type (``ValueError`` → ``INVALID_ARGUMENT``,
  ``KeyError`` → ``NOT_FOUND``, ``NotImplementedError`` → ``UNIMPLEMENTED``, the rest
  ``UNKNOWN``) and carries a detail that pyarrow's C++ renders, when the status is sent,
  by calling ``traceback.format_exception`` — so the client reads the server's traceback,
  file paths included.

There is no way from Python to send ``INVALID_ARGUMENT`` without that detail, so the
detail is made harmless: :func:`install` wraps ``traceback.format_exception`` so that for
a :class:`RefusalError` (and only for one) it renders the status name instead of the
traceback. Everything else — server logs, other exceptions — formats as before.
Handlers raise nothing else to the client: :func:`refusals` turns every exception into
a :class:`RefusalError` (unexpected ones are logged with their traceback and told to the
client as ``INTERNAL`` with an incident id).

==============================  =================  =====================================
raised                          gRPC status        when
==============================  =================  =====================================
:class:`InvalidArgumentError`   INVALID_ARGUMENT   a bad ticket, descriptor, action body
                                                   or put batch; an unknown (or
                                                   unreadable) topic
:class:`NotFoundError`          NOT_FOUND          a SQL table the caller may not read
                                                   or that does not exist
:class:`UnimplementedError`     UNIMPLEMENTED      a verb the gateway does not serve
:class:`UnauthenticatedError`   UNAUTHENTICATED    no or a bad token / password
:class:`PermissionDeniedError`  PERMISSION_DENIED  a write the token may not make
:class:`UnavailableError`       UNAVAILABLE        a per-caller stream limit; a follow
                                                   stream too far behind; a transient
                                                   gateway fault; a partition asked of
                                                   a group member before its
                                                   assignment arrived
:class:`ServerFailedError`      UNKNOWN            the broker refused a put
:class:`InternalError`          INTERNAL           a gateway bug (``UNKNOWN`` in
                                                   get_schema)
==============================  =================  =====================================
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, ParamSpec, TypeVar

import pyarrow as pa
import pyarrow.flight as fl

from thalweg.errors import PartitionElsewhereError, ThalwegError, TicketError

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 1000

P = ParamSpec("P")
R = TypeVar("R")


class RefusalError(Exception):
    """An error whose message is all the client sees (see the module docstring)."""

    status: ClassVar[str] = "UNKNOWN"


class InvalidArgumentError(RefusalError, pa.ArrowInvalid):  # type: ignore[misc]
    status = "INVALID_ARGUMENT"


class NotFoundError(RefusalError, pa.ArrowKeyError):  # type: ignore[misc]
    status = "NOT_FOUND"

    def __str__(self) -> str:  # a KeyError quotes its message; this one reads as text
        return str(self.args[0]) if self.args else ""


class UnimplementedError(RefusalError, pa.ArrowNotImplementedError):  # type: ignore[misc]
    status = "UNIMPLEMENTED"


class UnauthenticatedError(RefusalError, fl.FlightUnauthenticatedError):  # type: ignore[misc]
    status = "UNAUTHENTICATED"


class PermissionDeniedError(RefusalError, fl.FlightUnauthorizedError):  # type: ignore[misc]
    status = "PERMISSION_DENIED"


class UnavailableError(RefusalError, fl.FlightUnavailableError):  # type: ignore[misc]
    status = "UNAVAILABLE"


class CallCancelledError(RefusalError, fl.FlightCancelledError):  # type: ignore[misc]
    status = "CANCELLED"


class TimedOutError(RefusalError, fl.FlightTimedOutError):  # type: ignore[misc]
    status = "DEADLINE_EXCEEDED"


class ServerFailedError(RefusalError, fl.FlightServerError):  # type: ignore[misc]
    status = "UNKNOWN"


class InternalError(RefusalError, fl.FlightInternalError):  # type: ignore[misc]
    status = "INTERNAL"


# Most specific first: FlightCancelledError is also an ArrowCancelled, and so on.
_FLIGHT: tuple[tuple[type[Exception], type[RefusalError]], ...] = (
    (fl.FlightUnauthenticatedError, UnauthenticatedError),
    (fl.FlightUnauthorizedError, PermissionDeniedError),
    (fl.FlightUnavailableError, UnavailableError),
    (fl.FlightCancelledError, CallCancelledError),
    (fl.FlightTimedOutError, TimedOutError),
    (fl.FlightInternalError, InternalError),
    (fl.FlightError, ServerFailedError),
)


def clean(message: str) -> str:
    """A message fit for a client: nothing of a traceback pyarrow may have appended to a
    wrapped error, and at most :data:`MAX_MESSAGE_CHARS` characters."""
    for marker in (". Detail: Python exception", "\nTraceback (most recent call last)"):
        message = message.split(marker, 1)[0]
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 1] + "…"
    return message


def refusal(exc: Exception, verb: str) -> RefusalError:
    """What the client is told about ``exc``, raised while serving ``verb``.

    Refusals pass as they are; a :class:`TicketError` is ``INVALID_ARGUMENT``; a Flight
    error keeps its status. Anything else is a fault of the gateway: it is logged with
    its traceback, and the client gets ``INTERNAL`` (``UNAVAILABLE`` when retrying can
    help) with an incident id to find it in the log, never the exception's own text,
    which may name files on the gateway.
    """
    if isinstance(exc, RefusalError):
        message = clean(str(exc))
        return exc if message == str(exc) else type(exc)(message)
    if isinstance(exc, TicketError):
        return InvalidArgumentError(clean(str(exc)))
    for flight_cls, cls in _FLIGHT:
        if isinstance(exc, flight_cls):
            return cls(clean(str(exc)))
    incident = secrets.token_hex(4)
    log.error("flight %s failed (incident %s)", verb, incident, exc_info=exc)
    if isinstance(exc, ThalwegError) and exc.retriable:
        return UnavailableError(f"{verb} failed for now (incident {incident}); retry")
    return InternalError(f"{verb} failed inside the gateway (incident {incident}, in its log)")


def relocation(exc: PartitionElsewhereError) -> UnavailableError:
    """``UNAVAILABLE`` naming the owner, with ``{"relocate": {"topic", "owner",
    "positions": {partition: resume offset}}}`` as the error's binary detail
    (``FlightError.extra_info`` on the client) so a client resumes there exactly."""
    detail = {
        "relocate": {
            "topic": exc.topic,
            "owner": exc.owner,
            "positions": {str(p): pos for p, pos in exc.positions.items()},
        }
    }
    return UnavailableError(clean(str(exc)), json.dumps(detail).encode())


def refusing(items: Iterator[R], verb: str) -> Iterator[R]:
    """``items``, with whatever it raises turned into a :class:`RefusalError`."""
    try:
        yield from items
    except Exception as exc:
        told = refusal(exc, verb)
        if told is exc:
            raise
        raise told from exc


def refusals(handler: Callable[P, R]) -> Callable[P, R]:
    """Decorate a Flight handler so that all it raises, also while the client iterates
    what it returned (``list_flights``, ``do_action``), is a :class:`RefusalError`."""
    verb = handler.__name__

    @functools.wraps(handler)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            result = handler(*args, **kwargs)
        except Exception as exc:
            told = refusal(exc, verb)
            if told is exc:
                raise
            raise told from exc
        if isinstance(result, Iterator):
            return refusing(result, verb)  # type: ignore[return-value]
        return result

    return wrapper


_installed = threading.Lock()


def install() -> None:
    """Make pyarrow render a :class:`RefusalError` as its status name, not a traceback
    (idempotent). pyarrow calls ``traceback.format_exception(type, value, tb)`` when it
    sends a Python error to a client; nothing else in the gateway calls it for a
    RefusalError, and every other exception is passed through untouched."""
    with _installed:
        current = traceback.format_exception
        if getattr(current, "_thalweg_refusals", False):
            return

        @functools.wraps(current)
        def format_exception(exc: Any, /, *args: Any, **kwargs: Any) -> list[str]:
            value = args[0] if args else kwargs.get("value", exc)
            if isinstance(value, RefusalError):
                return [value.status]
            return current(exc, *args, **kwargs)

        format_exception._thalweg_refusals = True  # type: ignore[attr-defined]
        traceback.format_exception = format_exception
