"""Prometheus metrics of one gateway, in a registry of its own.

A private :class:`CollectorRegistry` (not the process default) lets several gateways run
in one process, as the tests do, without name clashes. Names are transport-neutral
(``twg_source_*``) so Kafka and Pulsar share one dashboard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class Metrics:
    """Every metric the gateway exports."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        part = ["source", "topic", "partition"]
        self.records = Counter("twg_source_records", "Records consumed.", part, registry=r)
        self.bytes = Counter("twg_source_bytes", "Key + value bytes consumed.", part, registry=r)
        self.consumed = Gauge(
            "twg_partition_consumed_position",
            "Position after the last consumed record (Kafka: offset; Pulsar: packed id).",
            part,
            registry=r,
        )
        self.durable = Gauge(
            "twg_partition_durable_position",
            "Exclusive end of the durable raw lane, as a position.",
            part,
            registry=r,
        )
        self.committed = Gauge(
            "twg_partition_committed_position",
            "Position committed (Kafka) or acknowledged up to (Pulsar) at the source.",
            part,
            registry=r,
        )
        self.fenced = Counter(
            "twg_fenced_records",
            "Records this member did not write because its ownership of the partition was "
            "in doubt — a zombie after a pause past its session: dropped from its buffers "
            "(a segment write refused meanwhile goes back there first); the owner reads "
            "them again (docs/lanes.md).",
            part,
            registry=r,
        )
        self.owned = Gauge(
            "twg_partition_owned",
            "1 for each partition of the consumer group this gateway owns, 0 for one "
            "another member owns (from the group's owner map; docs/lanes.md).",
            ["topic", "partition"],
            registry=r,
        )
        self.diverged = Gauge(
            "twg_partition_diverged",
            "1 while a partition is held because its broker log no longer continues the "
            "lane (docs/operations.md).",
            part,
            registry=r,
        )
        self.lag = Gauge(
            "twg_partition_lag_records",
            "Records behind: broker (latest - consumed; Kafka only), durable (received, "
            "not yet durable), commit (durable - committed, in positions).",
            [*part, "kind"],
            registry=r,
        )
        self.commit_seconds = Histogram(
            "twg_commit_seconds",
            "Time to commit a durable position to the source.",
            ["source"],
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.raw_file_bytes = Histogram(
            "twg_raw_file_bytes",
            "Size of each raw-lane segment made durable.",
            ["topic"],
            registry=r,
            buckets=(64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20),
        )
        self.stage_records = Counter(
            "twg_stage_records",
            "Records through each pipeline stage (fetch, decode, write, commit).",
            ["stage"],
            registry=r,
        )
        self.raw_files = Counter(
            "twg_raw_files_written", "Raw-lane segments made durable.", ["topic"], registry=r
        )
        self.raw_bytes = Counter(
            "twg_raw_bytes_written",
            "Bytes of raw-lane segments made durable.",
            ["topic"],
            registry=r,
        )
        self.raw_rows = Counter(
            "twg_raw_rows_written",
            "Rows in raw-lane segments made durable.",
            ["topic"],
            registry=r,
        )
        self.write_seconds = Histogram(
            "twg_raw_write_seconds",
            "Time to make one segment durable.",
            ["topic"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.write_errors = Counter(
            "twg_raw_write_errors", "Failed raw-lane writes (retried).", ["topic"], registry=r
        )
        self.commit_errors = Counter(
            "twg_source_commit_errors",
            "Failed offset commits (retried).",
            ["source"],
            registry=r,
        )
        self.decode_failures = Counter(
            "twg_decode_failures",
            "Payloads that did not decode, by reason.",
            ["topic", "reason"],
            registry=r,
        )
        self.registry_errors = Counter(
            "twg_registry_errors",
            "Schema registry requests that failed (retried).",
            ["source"],
            registry=r,
        )
        self.dlq_records = Counter(
            "twg_dlq_records", "Records written to the dead-letter lane.", ["topic"], registry=r
        )
        self.retries = Counter(
            "twg_retries",
            "Retries of retriable failures, by stage (connect, fetch, registry, write).",
            ["stage"],
            registry=r,
        )
        self.retries_exhausted = Counter(
            "twg_retries_exhausted",
            "Retries given up past their bound, by stage (registry: the records needing "
            "that schema went to the dead-letter lane as retry_exhausted).",
            ["stage"],
            registry=r,
        )
        self.throttled = Counter(
            "twg_source_throttled_seconds",
            "Seconds a source waited for its rate limits.",
            ["source"],
            registry=r,
        )
        self.budget_records = Gauge(
            "twg_source_budget_records",
            "Records the next poll may bring (bytes left under the bound / p95 size).",
            ["source"],
            registry=r,
        )
        self.buffered_bytes = Gauge(
            "twg_buffered_bytes", "Bytes fetched but not yet durable.", registry=r
        )
        self.paused = Gauge(
            "twg_source_paused",
            "1 while fetching is paused for backpressure.",
            ["source"],
            registry=r,
        )
        self.flight_calls = Counter(
            "twg_flight_calls", "Flight calls by method.", ["method"], registry=r
        )
        self.flight_rows = Counter(
            "twg_flight_rows", "Rows sent by Flight.", ["method"], registry=r
        )
        self.flight_bytes = Counter(
            "twg_flight_bytes", "Arrow bytes sent by Flight.", ["method"], registry=r
        )
        self.flight_active_streams = Gauge(
            "twg_flight_active_streams", "Open do_get streams.", registry=r
        )
        arrow = Gauge(
            "twg_arrow_allocated_bytes",
            "Bytes Arrow's default memory pool holds now (buffered batches, caches, "
            "decoding); RSS above it is the allocator's and Python's.",
            registry=r,
        )
        arrow.set_function(pa.total_allocated_bytes)
        # Zeros until the gateway hands over its cache (so the names always exist).
        self._cache = _CacheCollector(lambda: (0, 0, 0))
        r.register(self._cache)

        sink = ["sink"]
        self.sink_rows = Counter(
            "twg_sink_rows_written", "Rows a secondary sink made durable.", sink, registry=r
        )
        self.sink_lag = Gauge(
            "twg_sink_lag_records",
            "Positions the raw lane holds that the sink has not landed durably.",
            sink,
            registry=r,
        )
        self.sink_errors = Counter(
            "twg_sink_errors",
            "Failed sink writes or flushes, by reason (unavailable, schema, backpressure).",
            ["sink", "reason"],
            registry=r,
        )
        self.sink_flush_seconds = Histogram(
            "twg_sink_flush_seconds",
            "Time of one sink flush (its commit).",
            sink,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )

        self.node_queue_depth = Gauge(
            "twg_node_queue_depth",
            "Rows handed to a pipeline node and not yet returned by it.",
            ["node"],
            registry=r,
        )
        self.node_rows = Counter(
            "twg_node_rows", "Rows a pipeline node returned (derived rows).", ["node"], registry=r
        )
        self._lane_upkeep(r)
        self.sink_dead_letters = Counter(
            "twg_sink_dead_letters",
            "Records a sink's destination refused for good, set aside in the sink's "
            "dead-letter lane (on_refused = dead_letter).",
            ["sink"],
            registry=r,
        )
        self.sink_rows_lost = Counter(
            "twg_sink_rows_lost",
            "Rows a sink's destination had held and no longer did (deleted behind the "
            "gateway's back), found by the feeder's recheck and fed again.",
            ["sink"],
            registry=r,
        )
        self.node_dead_letters = Counter(
            "twg_node_dead_letters",
            "Records a pipeline node refused, written to its dead-letter lane, by reason "
            "(transform, udf_exhausted); a replay of the same segment counts them again.",
            ["node", "reason"],
            registry=r,
        )

    def _lane_upkeep(self, r: CollectorRegistry) -> None:
        """Retention and compaction (lane/upkeep/retention.py, lane/upkeep/compaction.py)."""
        self.retention_removed_files = Counter(
            "twg_retention_removed_files",
            "Lane files retention deleted (every lane, node lanes included).",
            ["topic"],
            registry=r,
        )
        self.retention_removed_bytes = Counter(
            "twg_retention_removed_bytes", "Bytes retention deleted.", ["topic"], registry=r
        )
        self.retention_held = Gauge(
            "twg_retention_held",
            "1 while a sink that has not landed a partition's oldest records holds its "
            "retention back (wait_for_sinks).",
            ["topic", "partition"],
            registry=r,
        )
        self.lane_floor = Gauge(
            "twg_lane_floor",
            "A partition's first position kept by retention (0: nothing removed).",
            ["topic", "partition"],
            registry=r,
        )
        self.lane_files = Gauge(
            "twg_lane_files",
            "Raw files of a partition on disk (compaction keeps it bounded).",
            ["topic", "partition"],
            registry=r,
        )
        self.compaction_merged = Counter(
            "twg_compaction_merged_files",
            "Small segments compaction merged into larger files.",
            ["topic"],
            registry=r,
        )
        self.compaction_backlog = Gauge(
            "twg_compaction_backlog_files",
            "Small segments due for merging and not merged yet (compaction lag).",
            ["topic", "partition"],
            registry=r,
        )
        self.compaction_seconds = Histogram(
            "twg_compaction_seconds", "One merge (every lane of one run).", registry=r
        )

    def watch_segment_cache(
        self,
        read: Callable[[], tuple[int, int, int]],
        copies: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        """Export the segment cache: ``read()`` gives (bytes held, hits, misses);
        ``copies()`` the IPC copies' (bytes on disk, reads answered)."""
        self._cache.read = read
        self._cache.copies = copies

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _CacheCollector(Collector):
    """Reads the segment cache's own counters at scrape time (no lock on the read path)."""

    def __init__(self, read: Callable[[], tuple[int, int, int]]) -> None:
        self.read = read
        self.copies: Callable[[], tuple[int, int]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        held, hits, misses = self.read()
        yield GaugeMetricFamily(
            "twg_segment_cache_bytes", "Bytes of lane segments held in memory for reads.", held
        )
        requests = CounterMetricFamily(
            "twg_segment_cache_requests",
            "Segment reads by whether the memory cache held the segment.",
            labels=["result"],
        )
        requests.add_metric(["hit"], hits)
        requests.add_metric(["miss"], misses)
        yield requests
        if self.copies is not None:
            on_disk, answered = self.copies()
            yield GaugeMetricFamily(
                "twg_ipc_copy_bytes",
                "Bytes of Arrow IPC copies of decoded segments on disk (cold reads map them).",
                on_disk,
            )
            yield CounterMetricFamily(
                "twg_ipc_copy_reads", "Segment reads answered from an IPC copy.", answered
            )
