"""The decode stage and, later, the transform DAG: what happens to a fetched batch
between the raw lane and the decoded lane.

``decoders`` builds one source's decoders (one per topic, behind the size guard, the
registry's schema gate, the schema limits and the data contract); ``decode`` turns one
fetched raw batch into decoded-lane rows (payload + locator + error, row for row);
``redecode`` rebuilds a decoded segment from its raw twin at start-up. Pure of
transports, Flight and the engine: the engine calls in, nothing here calls out.
"""

from __future__ import annotations

from thalweg.pipeline.decode import decode_batch
from thalweg.pipeline.decoders import TopicDecoders, schema_limits

__all__ = ["TopicDecoders", "decode_batch", "schema_limits"]
