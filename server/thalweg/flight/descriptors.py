"""Path descriptors ``["topics", <topic>]``: how reads and puts both name a topic.

One parser for both verbs, so a descriptor a client builds once means the same topic
whether it reads or writes with it.
"""

from __future__ import annotations

import pyarrow.flight as fl

from thalweg.errors import TicketError


def text(part: bytes | str) -> str:
    """A descriptor path part as text (undecodable bytes replaced, never raised on)."""
    return part.decode(errors="replace") if isinstance(part, bytes) else part


def path_topic(descriptor: fl.FlightDescriptor) -> str:
    """The topic of a path descriptor; raises :class:`TicketError` for any other path."""
    path = [text(p) for p in descriptor.path]
    if len(path) != 2 or path[0] != "topics" or not path[1]:
        raise TicketError(f"unknown descriptor path {path!r}; use ['topics', <topic>]")
    return str(path[1])
