"""The admin HTTP server: /live, /ready, /health, /metrics, /stats.

Standard library only (``ThreadingHTTPServer`` on a daemon thread): it must answer even
when the event loop is stuck, because saying so is its job.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from thalweg.ops.health import Health
from thalweg.ops.metrics import Metrics
from thalweg.ops.stats import PipelineStats

log = logging.getLogger(__name__)


class AdminServer:
    """Serves the operator endpoints of one gateway."""

    def __init__(
        self,
        host: str,
        port: int,
        health: Health,
        metrics: Metrics,
        stats: PipelineStats | None = None,
        *,
        metrics_enabled: bool = True,
        group: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        handler = _handler(health, metrics, stats, metrics_enabled, group)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        address = self._server.server_address
        self.host, self.port = str(address[0]), int(address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="twg-admin", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(
    health: Health,
    metrics: Metrics,
    stats: PipelineStats | None,
    metrics_enabled: bool,
    group: Callable[[], dict[str, Any]] | None,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/live":
                ok = health.live()
                self._json(200 if ok else 503, {"live": ok})
            elif path == "/ready":
                ok = health.ready()
                self._json(200 if ok else 503, {"ready": ok, **health.tree()})
            elif path == "/health":
                tree = health.tree()
                self._json(200 if tree["ready"] else 503, tree)
            elif path == "/stats":
                body = stats.snapshot() if stats is not None else {"stages": {}}
                if group is not None:
                    body["group"] = group()  # the consumer group's partition owners
                self._json(200, body)
            elif path == "/metrics" and metrics_enabled:
                self._send(200, metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/metrics":
                self._json(404, {"error": "metrics are disabled (gateway.metrics_enabled)"})
            else:
                self._json(
                    404,
                    {
                        "error": f"no such endpoint {path}",
                        "endpoints": ["/live", "/ready", "/health", "/metrics", "/stats"],
                    },
                )

        def _json(self, status: int, body: dict[str, Any]) -> None:
            self._send(status, json.dumps(body).encode(), "application/json")

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("admin: " + format, *args)

    return Handler
