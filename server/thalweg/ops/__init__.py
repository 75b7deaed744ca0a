"""Operator surface: Prometheus metrics, the health tree, and the admin HTTP server."""

from __future__ import annotations
