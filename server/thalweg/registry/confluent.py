"""A client of the Confluent Schema Registry REST API (also Redpanda, Apicurio's ccompat).

Endpoints used: ``GET /schemas/ids/{id}`` (decode), ``GET /subjects/{s}/versions/{v}``
and ``POST /subjects/{s}/versions`` (encode). Basic auth or a bearer token, TLS through
an ``ssl.SSLContext``. Blocking (``urllib``): the engine calls it on a worker thread.

Errors: 404 → ``None`` (an unknown id is a per-record decode failure); connection
refused, timeouts and 5xx → :class:`RegistryUnavailableError` (retriable: the records wait);
401/403 and malformed answers → :class:`RegistryError`.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import urllib.error
import urllib.request
from typing import Any

from thalweg.registry.errors import RegistryError, RegistryUnavailableError

_ACCEPT = "application/vnd.schemaregistry.v1+json"


class ConfluentRegistry:
    """Cached Confluent REST client.

    Args:
        url: base URL, e.g. ``http://127.0.0.1:8081``.
        username, password: basic auth.
        token: bearer token (instead of basic auth).
        ssl_context: for https registries with a private CA or client certificates.
        timeout_s: per request.
    """

    def __init__(
        self,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Accept": _ACCEPT}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        elif username is not None:
            cred = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
            self._headers["Authorization"] = f"Basic {cred}"
        self._ssl = ssl_context
        self._timeout = timeout_s
        self._cache: dict[int, Any] = {}
        self._lock = threading.Lock()

    def get(self, schema_id: int) -> Any | None:
        """A cached schema, without I/O (None when not fetched yet or unknown)."""
        with self._lock:
            return self._cache.get(schema_id)

    def fetch(self, schema_id: int) -> Any | None:
        """The writer schema of ``schema_id`` (parsed JSON), None when the registry says
        404. Raises :class:`RegistryUnavailableError` when it cannot answer."""
        with self._lock:
            if schema_id in self._cache:
                return self._cache[schema_id]
        body = self._request("GET", f"/schemas/ids/{schema_id}")
        if body is None:
            return None
        schema = self._parse_schema(body, f"schema id {schema_id}")
        with self._lock:
            self._cache[schema_id] = schema
        return schema

    def fetch_raw(self, schema_id: int) -> tuple[str, str] | None:
        """``(schemaType, schema text)`` of any kind of schema (Avro, Protobuf, JSON)."""
        body = self._request("GET", f"/schemas/ids/{schema_id}")
        if body is None:
            return None
        try:
            return str(body.get("schemaType", "AVRO")), str(body["schema"])
        except KeyError as exc:
            raise RegistryError(f"malformed registry answer for schema id {schema_id}") from exc

    def register(self, subject: str, schema: Any) -> int:
        """Register (or look up) ``schema`` under ``subject``; returns its id."""
        payload = json.dumps({"schema": json.dumps(schema)}).encode()
        body = self._request("POST", f"/subjects/{subject}/versions", payload)
        if body is None or "id" not in body:
            raise RegistryError(f"registry did not return an id for subject {subject!r}")
        schema_id = int(body["id"])
        with self._lock:
            self._cache[schema_id] = schema
        return schema_id

    def latest(self, subject: str) -> tuple[int, Any] | None:
        """The latest ``(id, schema)`` of ``subject``, None when the subject is unknown."""
        body = self._request("GET", f"/subjects/{subject}/versions/latest")
        if body is None:
            return None
        return int(body["id"]), self._parse_schema(body, f"subject {subject!r}")

    def latest_raw(self, subject: str) -> tuple[int, str, str] | None:
        """The latest ``(id, schemaType, text)`` of ``subject`` (any kind), None when the
        subject is unknown."""
        body = self._request("GET", f"/subjects/{subject}/versions/latest")
        if body is None:
            return None
        try:
            return int(body["id"]), str(body.get("schemaType", "AVRO")), str(body["schema"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryError(f"malformed registry answer for subject {subject!r}") from exc

    @staticmethod
    def _parse_schema(body: dict[str, Any], what: str) -> Any:
        try:
            if body.get("schemaType", "AVRO") != "AVRO":
                raise RegistryError(f"{what} is {body['schemaType']}, not Avro")
            return json.loads(body["schema"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryError(f"malformed registry answer for {what}: {exc}") from exc

    def _request(self, method: str, path: str, data: bytes | None = None) -> dict[str, Any] | None:
        headers = dict(self._headers)
        if data is not None:
            headers["Content-Type"] = _ACCEPT
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self._timeout, context=self._ssl) as resp:
                answer: dict[str, Any] = json.loads(resp.read())
                return answer
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if exc.code >= 500:
                raise RegistryUnavailableError(f"registry {self.url} answered {exc.code}") from exc
            raise RegistryError(f"registry {self.url} refused {method} {path}: {exc.code}") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLCertVerificationError):
                # Configuration, not an outage: retrying cannot fix an untrusted certificate.
                why = exc.reason.verify_message
                raise RegistryError(
                    f"registry {self.url}: TLS certificate not trusted ({why}); set ssl_cafile"
                ) from exc
            raise RegistryUnavailableError(f"registry {self.url} unreachable: {exc}") from exc
        except (TimeoutError, ConnectionError) as exc:
            raise RegistryUnavailableError(f"registry {self.url} unreachable: {exc}") from exc
        except ValueError as exc:
            raise RegistryError(f"registry {self.url} sent something that is not JSON") from exc


def topic_subject(topic: str, *, key: bool = False) -> str:
    """Confluent's default TopicNameStrategy: ``<topic>-value`` (or ``-key``)."""
    return f"{topic}-{'key' if key else 'value'}"
