"""An in-process Confluent Schema Registry for tests (no real one installs here).

Implements what Thalweg uses, with the real API's status codes and error bodies:
``GET /schemas/ids/{id}``, ``GET /subjects/{s}/versions/{v|latest}``,
``POST /subjects/{s}/versions`` (idempotent per schema). Optional basic or bearer auth
(401 otherwise); ``down = True`` answers 503 to everything; ``stop()`` refuses connections.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeRegistry:
    def __init__(
        self,
        *,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tls: tuple[str, str] | None = None,
    ) -> None:
        self.schemas: dict[int, str] = {}
        self.types: dict[int, str] = {}
        self.subjects: dict[str, list[int]] = {}
        self.requests: list[str] = []
        self.down = False
        self._auth = None
        if token:
            self._auth = f"Bearer {token}"
        elif username is not None:
            self._auth = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                """Quiet: tests read ``registry.requests`` instead of a log."""

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _guard(self) -> bool:
                registry.requests.append(f"{self.command} {self.path}")
                if registry.down:
                    self._reply(503, {"error_code": 50301, "message": "Service unavailable"})
                    return False
                if registry._auth and self.headers.get("Authorization") != registry._auth:
                    self._reply(401, {"error_code": 401, "message": "Unauthorized"})
                    return False
                return True

            def do_GET(self) -> None:
                if not self._guard():
                    return
                parts = self.path.strip("/").split("/")
                if parts[:2] == ["schemas", "ids"] and len(parts) == 3:
                    sid = int(parts[2])
                    if sid in registry.schemas:
                        body = {"schema": registry.schemas[sid]}
                        if registry.types[sid] != "AVRO":  # the real API omits AVRO
                            body["schemaType"] = registry.types[sid]
                        self._reply(200, body)
                    else:
                        self._reply(404, {"error_code": 40403, "message": "Schema not found"})
                    return
                if parts[0] == "subjects" and len(parts) == 4 and parts[2] == "versions":
                    versions = registry.subjects.get(parts[1])
                    if not versions:
                        self._reply(404, {"error_code": 40401, "message": "Subject not found"})
                        return
                    v = len(versions) if parts[3] == "latest" else int(parts[3])
                    if not 1 <= v <= len(versions):
                        self._reply(404, {"error_code": 40402, "message": "Version not found"})
                        return
                    sid = versions[v - 1]
                    answer = {
                        "subject": parts[1],
                        "version": v,
                        "id": sid,
                        "schema": registry.schemas[sid],
                    }
                    if registry.types[sid] != "AVRO":
                        answer["schemaType"] = registry.types[sid]
                    self._reply(200, answer)
                    return
                self._reply(404, {"error_code": 404, "message": "Not found"})

            def do_POST(self) -> None:
                if not self._guard():
                    return
                parts = self.path.strip("/").split("/")
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                if parts[0] == "subjects" and len(parts) == 3 and parts[2] == "versions":
                    self._reply(200, {"id": registry.add(parts[1], body["schema"])})
                else:
                    self._reply(404, {"error_code": 404, "message": "Not found"})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:  # (certfile, keyfile)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def add(self, subject: str, schema: str | dict[str, Any], schema_type: str = "AVRO") -> int:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        known = {existing: sid for sid, existing in self.schemas.items()}
        sid = known.get(text, len(self.schemas) + 1)
        self.schemas[sid] = text
        self.types[sid] = schema_type
        versions = self.subjects.setdefault(subject, [])
        if sid not in versions:
            versions.append(sid)
        return sid

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
