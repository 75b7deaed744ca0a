"""Lanes in an object store: the bucket client and the mirror between it and the local
cache (durable once PUT, resolved by generation)."""
