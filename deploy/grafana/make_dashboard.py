"""Write thalweg-dashboard.json (Grafana 10+, Prometheus data source) from the panel list
below. Rerun after changing a panel; tests/unit/ops/test_dashboard.py checks that every
metric the dashboard queries is one the gateway exports."""

from __future__ import annotations

import json
from pathlib import Path

DS = {"type": "prometheus", "uid": "${datasource}"}

PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    # (title, unit, [(expr, legend)])
    (
        "Records consumed /s",
        "ops",
        [("sum by (topic) (rate(twg_source_records_total[1m]))", "{{topic}}")],
    ),
    (
        "Bytes consumed /s",
        "Bps",
        [("sum by (topic) (rate(twg_source_bytes_total[1m]))", "{{topic}}")],
    ),
    (
        "Lag (records)",
        "short",
        [("max by (topic, kind) (twg_partition_lag_records)", "{{topic}} {{kind}}")],
    ),
    (
        "Records through each stage /s",
        "ops",
        [("sum by (stage) (rate(twg_stage_records_total[1m]))", "{{stage}}")],
    ),
    (
        "Commit latency p99",
        "s",
        [("histogram_quantile(0.99, sum by (le) (rate(twg_commit_seconds_bucket[5m])))", "p99")],
    ),
    (
        "Raw segment write p99",
        "s",
        [("histogram_quantile(0.99, sum by (le) (rate(twg_raw_write_seconds_bucket[5m])))", "p99")],
    ),
    (
        "Raw segment size p50",
        "bytes",
        [("histogram_quantile(0.5, sum by (le) (rate(twg_raw_file_bytes_bucket[15m])))", "p50")],
    ),
    (
        "Decode failures /s by reason",
        "ops",
        [("sum by (reason) (rate(twg_decode_failures_total[5m]))", "{{reason}}")],
    ),
    ("Dead letters /s", "ops", [("sum by (topic) (rate(twg_dlq_records_total[5m]))", "{{topic}}")]),
    ("Retries /s by stage", "ops", [("sum by (stage) (rate(twg_retries_total[5m]))", "{{stage}}")]),
    (
        "Retries given up /s by stage",
        "ops",
        [("sum by (stage) (rate(twg_retries_exhausted_total[5m]))", "{{stage}}")],
    ),
    (
        "Segment cache",
        "percentunit",
        [
            (
                'sum(rate(twg_segment_cache_requests_total{result="hit"}[5m])) '
                "/ sum(rate(twg_segment_cache_requests_total[5m]))",
                "hit ratio",
            )
        ],
    ),
    (
        "Errors /s",
        "ops",
        [
            ("sum(rate(twg_raw_write_errors_total[5m]))", "raw write"),
            ("sum(rate(twg_source_commit_errors_total[5m]))", "commit"),
            ("sum(rate(twg_registry_errors_total[5m]))", "registry"),
        ],
    ),
    (
        "Backpressure and rate limits",
        "short",
        [
            ("max by (source) (twg_source_paused)", "paused {{source}}"),
            (
                "sum by (source) (rate(twg_source_throttled_seconds_total[1m]))",
                "throttled s/s {{source}}",
            ),
            ("sum(twg_buffered_bytes)", "buffered bytes"),
            ("min by (source) (twg_source_budget_records)", "poll budget {{source}}"),
        ],
    ),
    (
        "Flight calls /s by method",
        "ops",
        [("sum by (method) (rate(twg_flight_calls_total[1m]))", "{{method}}")],
    ),
    (
        "Flight bytes /s",
        "Bps",
        [("sum by (method) (rate(twg_flight_bytes_total[1m]))", "{{method}}")],
    ),
    ("Flight open streams", "short", [("sum(twg_flight_active_streams)", "open")]),
    (
        "Raw lane written /s",
        "Bps",
        [("sum by (topic) (rate(twg_raw_bytes_written_total[5m]))", "{{topic}}")],
    ),
    # Secondary sinks (docs/sinks.md): how far each is behind the raw lane, and its
    # replay — a rising lag with flat rows written is a sink down; falling lag with rows
    # written well above the ingest rate is recovery draining a gap.
    (
        "Sink lag (positions behind the raw lane)",
        "short",
        [("max by (sink) (twg_sink_lag_records)", "{{sink}}")],
    ),
    (
        "Sink rows written /s (live and replay)",
        "ops",
        [("sum by (sink) (rate(twg_sink_rows_written_total[1m]))", "{{sink}}")],
    ),
    (
        "Sink errors /s by reason",
        "ops",
        [("sum by (sink, reason) (rate(twg_sink_errors_total[5m]))", "{{sink}} {{reason}}")],
    ),
    (
        "Sink flush p99",
        "s",
        [
            (
                "histogram_quantile(0.99, "
                "sum by (sink, le) (rate(twg_sink_flush_seconds_bucket[5m])))",
                "{{sink}}",
            )
        ],
    ),
]


def dashboard() -> dict[str, object]:
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "datasource": DS,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [
                    {"refId": chr(65 + j), "datasource": DS, "expr": e, "legendFormat": leg}
                    for j, (e, leg) in enumerate(targets)
                ],
            }
        )
    return {
        "title": "Thalweg gateway",
        "uid": "thalweg-gateway",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]
        },
        "panels": panels,
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("thalweg-dashboard.json")
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
