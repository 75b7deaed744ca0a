"""One source's engine: its fetch loop, partitions and their resume points, log
continuity, buffers, the checkpoint that commits only what is durable, its fence, and
the pacing around them. ``engine.gateway`` and ``engine.batch`` compose it."""
