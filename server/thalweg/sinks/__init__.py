"""Sinks: the destinations records go to besides the raw lane."""

from __future__ import annotations

from thalweg.sinks.kafka import KafkaWriter, Written

__all__ = ["KafkaWriter", "Written"]
