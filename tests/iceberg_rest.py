"""An Iceberg REST catalog for the tests: the REST spec's endpoints a writer uses (config,
OAuth2 tokens, namespaces, tables, commits with requirements, table credentials),
served over pyiceberg's SQL catalog on SQLite, on a free loopback port.

No REST catalog server is on the package registries here, so this one stands in for
Polaris, Unity, Nessie or Lakekeeper. It does what they do that a writer can get wrong:

* **vended credentials** — a table load that asks for them
  (``X-Iceberg-Access-Delegation: vended-credentials``) gets storage credentials from
  ``vend`` (moto's STS in the tests), as ``storage-credentials`` and ``config``;
* **auth** — a bearer token, OAuth2 client credentials (``/v1/oauth/tokens``), or an AWS
  SigV4 signature, each checked on every request (401 otherwise);
* **faults** — another writer's commit just before a commit (``before_commit``: the
  commit's requirements then fail, 409), and a commit applied whose answer is lost
  (``lose_answers``: 500, which pyiceberg raises as ``CommitStateUnknownException``).

The catalog writes table metadata with its own storage keys (``storage``); writers write
data files and manifests with what they were vended.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import traceback
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pyiceberg.catalog.rest import CreateTableRequest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.table import CommitTableRequest


@dataclass
class SigV4:
    """The one AWS identity whose signature the catalog accepts."""

    access_key_id: str
    secret_access_key: str
    region: str
    service: str = "execute-api"


@dataclass
class _Named:
    """What ``SqlCatalog.commit_table`` asks of a table: its name (the table may not
    exist yet: a staged create commits it)."""

    identifier: tuple[str, ...]

    def name(self) -> tuple[str, ...]:
        return self.identifier


_ERRORS: dict[type[Exception], tuple[int, str]] = {
    CommitFailedException: (409, "CommitFailedException"),
    NoSuchTableError: (404, "NoSuchTableException"),
    NoSuchNamespaceError: (404, "NoSuchNamespaceException"),
    TableAlreadyExistsError: (409, "AlreadyExistsException"),
    NamespaceAlreadyExistsError: (409, "AlreadyExistsException"),
}


@dataclass
class IcebergRestCatalog:
    """The server. ``storage``: pyiceberg FileIO properties the catalog itself writes
    metadata with (and a warehouse); ``vend``: the credentials a table load is vended."""

    root: Path
    warehouse: str
    storage: dict[str, str] = field(default_factory=dict)
    vend: Callable[[], dict[str, str]] | None = None
    token: str | None = None
    client: tuple[str, str] | None = None  # OAuth2 (client_id, client_secret)
    sigv4: SigV4 | None = None
    before_commit: list[Callable[[], None]] = field(default_factory=list)
    lose_answers: int = 0
    vended: int = 0
    commits: int = 0
    conflicts: int = 0
    seen_delegation: list[str] = field(default_factory=list)
    _issued: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.backing = SqlCatalog(
            "rest-backing",
            uri=f"sqlite:///{self.root / 'catalog.db'}",
            warehouse=self.warehouse,
            **self.storage,
        )
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- auth --------------------------------------------------------------------------

    def authorized(self, method: str, url: str, headers: dict[str, str], body: bytes) -> bool:
        if self.sigv4 is not None:
            return _signed_by(self.sigv4, method, url, headers, body)
        bearer = headers.get("authorization", "").removeprefix("Bearer ").strip()
        if self.client is not None:
            return bearer in self._issued
        if self.token is not None:
            return secrets.compare_digest(bearer, self.token)
        return True

    def issue(self, form: dict[str, str]) -> str | None:
        """An OAuth2 access token for the client's credentials, or None."""
        if self.client is None or form.get("grant_type") != "client_credentials":
            return None
        if (form.get("client_id"), form.get("client_secret")) != self.client:
            return None
        token = secrets.token_hex(16)
        self._issued.add(token)
        return token

    # -- tables ------------------------------------------------------------------------

    def loaded(self, ident: tuple[str, ...], delegation: str | None) -> dict[str, Any]:
        table = self.backing.load_table(ident)
        return self._result(table.metadata_location, table.metadata, delegation)

    def _result(
        self, location: str | None, metadata: Any, delegation: str | None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "metadata-location": location,
            "metadata": json.loads(metadata.model_dump_json()),
            "config": {},
        }
        if delegation:
            self.seen_delegation.append(delegation)
        if delegation and "vended-credentials" in delegation and self.vend is not None:
            creds = self.vend()
            self.vended += 1
            out["config"] = dict(creds)
            out["storage-credentials"] = [{"prefix": self.warehouse, "config": dict(creds)}]
        return out

    def create(self, ns: str, body: bytes, delegation: str | None) -> dict[str, Any]:
        fields = {"location": None, "partition-spec": None, "write-order": None}
        req = CreateTableRequest.model_validate({**fields, **json.loads(body)})
        ident = (ns, req.name)
        kwargs: dict[str, Any] = {"properties": req.properties}
        if req.location:
            kwargs["location"] = req.location
        if req.partition_spec is not None:
            kwargs["partition_spec"] = req.partition_spec
        if req.write_order is not None:
            kwargs["sort_order"] = req.write_order
        if req.stage_create:
            if self.backing.table_exists(ident):
                raise TableAlreadyExistsError(f"table {'.'.join(ident)} exists")
            staged = self.backing._create_staged_table(ident, req.table_schema, **kwargs)
            return self._result(staged.metadata_location, staged.metadata, delegation)
        table = self.backing.create_table(ident, req.table_schema, **kwargs)
        return self._result(table.metadata_location, table.metadata, delegation)

    def commit(self, ident: tuple[str, ...], body: bytes) -> tuple[int, dict[str, Any]]:
        req = CommitTableRequest.model_validate_json(body)
        hook = self.before_commit.pop(0) if self.before_commit else None
        if hook is not None:  # outside the lock: the hook's own commits come here too
            hook()
        with self._lock:  # one commit at a time
            try:
                done = self.backing.commit_table(_Named(ident), req.requirements, req.updates)  # type: ignore[arg-type]
            except CommitFailedException:
                self.conflicts += 1
                raise
            self.commits += 1
            if self.lose_answers:
                self.lose_answers -= 1
                return 500, _error(500, "ServiceFailureException", "the answer was lost")
            return 200, {
                "metadata-location": done.metadata_location,
                "metadata": json.loads(done.metadata.model_dump_json()),
            }


def _error(code: int, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}


def _handler(cat: IcebergRestCatalog) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the tests read the counters

        def _send(self, code: int, body: dict[str, Any] | None = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _body(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _serve(self) -> None:
            body = self._body()
            parsed = urllib.parse.urlsplit(self.path)
            path = parsed.path
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                if path == "/v1/oauth/tokens" and self.command == "POST":
                    form = dict(urllib.parse.parse_qsl(body.decode()))
                    token = cat.issue(form)
                    if token is None:
                        self._send(401, {"error": "invalid_client"})
                        return
                    self._send(
                        200,
                        {
                            "access_token": token,
                            "token_type": "bearer",
                            "expires_in": 3600,
                            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                        },
                    )
                    return
                url = f"http://{headers.get('host', '')}{self.path}"
                if not cat.authorized(self.command, url, headers, body):
                    self._send(401, _error(401, "NotAuthorizedException", "not authorized"))
                    return
                self._route(path, body, headers.get("x-iceberg-access-delegation"))
            except tuple(_ERRORS) as exc:
                code, kind = next(v for k, v in _ERRORS.items() if isinstance(exc, k))
                self._send(code, _error(code, kind, str(exc)))
            except Exception as exc:  # a bug here: said, not dropped as a lost answer
                traceback.print_exc()
                self._send(400, _error(400, "BadRequestException", f"{type(exc).__name__}: {exc}"))

        def _route(self, path: str, body: bytes, delegation: str | None) -> None:
            m = self.command
            if path == "/v1/config" and m == "GET":
                self._send(200, {"defaults": {}, "overrides": {}})
                return
            if path == "/v1/namespaces":
                if m == "GET":
                    listed = [list(ns) for ns in cat.backing.list_namespaces()]
                    self._send(200, {"namespaces": listed})
                else:
                    req = json.loads(body)
                    cat.backing.create_namespace(tuple(req["namespace"]), req.get("properties", {}))
                    self._send(200, {"namespace": req["namespace"], "properties": {}})
                return
            parts = [urllib.parse.unquote(p) for p in path.removeprefix("/v1/").split("/")]
            if len(parts) == 2 and parts[0] == "namespaces":
                ns = parts[1]
                if m == "DELETE":
                    cat.backing.drop_namespace(ns)
                    self._send(204)
                    return
                props = cat.backing.load_namespace_properties(ns)
                self._send(200, {"namespace": [ns], "properties": props})
                return
            if len(parts) == 3 and parts[2] == "tables":
                ns = parts[1]
                if m == "GET":
                    ids = [{"namespace": [ns], "name": i[-1]} for i in cat.backing.list_tables(ns)]
                    self._send(200, {"identifiers": ids})
                else:
                    self._send(200, cat.create(ns, body, delegation))
                return
            if len(parts) >= 4 and parts[2] == "tables":
                ident = (parts[1], parts[3])
                if len(parts) == 5 and parts[4] == "credentials":
                    cat.backing.load_table(ident)
                    vended = cat._result(None, cat.backing.load_table(ident).metadata, delegation)
                    self._send(200, {"storage-credentials": vended.get("storage-credentials", [])})
                elif m in ("GET", "HEAD"):
                    self._send(200, cat.loaded(ident, delegation))
                elif m == "POST":
                    code, answer = cat.commit(ident, body)
                    self._send(code, answer)
                elif m == "DELETE":
                    cat.backing.drop_table(ident)
                    self._send(204)
                return
            self._send(404, _error(404, "NotFound", f"{m} {path} is not served here"))

        do_GET = do_POST = do_DELETE = do_HEAD = _serve  # noqa: N815 (http.server's names)

    return Handler


def _signed_by(key: SigV4, method: str, url: str, headers: dict[str, str], body: bytes) -> bool:
    """Whether the request carries ``key``'s valid SigV4 signature (botocore's signer,
    run again over the headers the request says it signed)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    auth = headers.get("authorization", "")
    m = re.match(
        r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
        r"SignedHeaders=([^,]+), Signature=([0-9a-f]+)",
        auth,
    )
    if m is None or m.group(1) != key.access_key_id:
        return False
    if (m.group(3), m.group(4)) != (key.region, key.service):
        return False
    signed = m.group(5).split(";")
    split = urllib.parse.urlsplit(url)
    request = AWSRequest(
        method=method,
        url=f"{split.scheme}://{split.netloc}{split.path}",
        params=dict(urllib.parse.parse_qsl(split.query)),
        data=body,
        headers={h: headers[h] for h in signed if h in headers},
    )
    request.context["timestamp"] = headers.get("x-amz-date", "")
    creds = Credentials(key.access_key_id, key.secret_access_key)
    signer = SigV4Auth(creds, key.service, key.region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    return secrets.compare_digest(expected, m.group(6))
