"""Wires sources, lanes, Flight and the admin server into the running gateway."""

from __future__ import annotations

from thalweg.engine.gateway import Gateway

__all__ = ["Gateway"]
