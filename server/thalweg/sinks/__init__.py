"""Sinks: the destinations records go to besides the raw lane.

``base`` holds the Sink contract and ``loader`` maps a ``kind`` to its backend. Producing
back into a broker is the transports' work (``thalweg.kafka``, ``thalweg.pulsar``).
"""

from __future__ import annotations
