"""The Arrow Flight surface: tickets, read planning, and the server."""

from __future__ import annotations

from thalweg.flight.read.tickets import ReadTicket, parse_ticket

__all__ = ["ReadTicket", "parse_ticket"]
