"""The lanes' upkeep, each on its own schedule beside ingest: retention, compaction,
and (lanes in an object store) syncing the partitions other replicas own."""
