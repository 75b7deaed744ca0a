"""Reading the lanes: the catalog the Flight side asks, the Parquet reader and its
caches, the live tail, the decoded shape, and the gaps other replicas hold."""
