"""``[gateway.flight]`` and its tables: who may call the Flight server (tokens, users,
mTLS), how it serves (limits, follow streams) and Flight SQL."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from thalweg.config.common import MiB, _Model, _read_secret
from thalweg.errors import InvariantError


class FlightToken(_Model):
    """One caller of the Flight API and what it may do.

    ``read`` and ``write`` are topic-name patterns (``fnmatch``: ``orders``, ``orders.*``,
    ``*``). Reading covers list_flights, get_flight_info, get_schema, do_get and
    describe-topic; writing covers do_put. The token is given inline or, better, as
    ``token_file`` (read once at start; surrounding whitespace ignored).
    """

    name: str = Field(min_length=1)
    token: SecretStr | None = None
    token_file: Path | None = None
    read: list[str] = Field(default_factory=lambda: ["*"])
    write: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_source(self) -> FlightToken:
        if (self.token is None) == (self.token_file is None):
            raise ValueError("set exactly one of token and token_file")
        if self.token_file is not None:
            object.__setattr__(self, "token", _read_secret(self.token_file, "token"))
        if self.token is None:
            raise InvariantError("self.token is not set")
        if len(self.token.get_secret_value()) < 16:
            raise ValueError("tokens must be at least 16 characters")
        return self


class FlightUser(_Model):
    """A caller that signs in with HTTP basic credentials (Flight's basic-token handshake)
    and then uses the session token the gateway hands back. Permissions as for tokens."""

    name: str = Field(min_length=1, pattern=r"^[^:]+$")
    password: SecretStr | None = None
    password_file: Path | None = None
    read: list[str] = Field(default_factory=lambda: ["*"])
    write: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_source(self) -> FlightUser:
        if (self.password is None) == (self.password_file is None):
            raise ValueError("set exactly one of password and password_file")
        if self.password_file is not None:
            object.__setattr__(self, "password", _read_secret(self.password_file, "password"))
        if self.password is None:
            raise InvariantError("self.password is not set")
        if len(self.password.get_secret_value()) < 8:
            raise ValueError("passwords must be at least 8 characters")
        return self


class FlightAuthConfig(_Model):
    """Who may call the Flight API; without this section the Flight API is open."""

    tokens: list[FlightToken] = Field(default_factory=list)
    users: list[FlightUser] = Field(default_factory=list)
    session_ttl_s: float = Field(
        3600.0, gt=0, description="Lifetime of a session token issued to a basic-auth user."
    )

    @model_validator(mode="after")
    def _someone(self) -> FlightAuthConfig:
        if not self.tokens and not self.users:
            raise ValueError("auth needs at least one token or user")
        names = [t.name for t in self.tokens] + [u.name for u in self.users]
        if len(set(names)) != len(names):
            raise ValueError("auth: two callers share a name")
        return self


class FlightTlsConfig(_Model):
    """TLS for the Flight server; with ``client_ca_file``, mutual TLS (a client must
    present a certificate signed by that CA before any call is served)."""

    cert_file: Path = Field(description="PEM certificate chain of the server.")
    key_file: Path = Field(description="PEM private key of the server.")
    client_ca_file: Path | None = Field(
        None, description="PEM CA bundle; when set, client certificates are required."
    )

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        """The PEM bytes, with a config error naming the file that cannot be read."""
        out: list[bytes | None] = []
        for name in ("cert_file", "key_file", "client_ca_file"):
            path = getattr(self, name)
            if path is None:
                out.append(None)
                continue
            try:
                out.append(Path(path).read_bytes())
            except OSError as exc:
                raise ValueError(f"gateway.tls.{name}: cannot read {path}: {exc.strerror}") from exc
        cert, key, ca = out
        if cert is None:
            raise InvariantError("cert is not set")
        if key is None:
            raise InvariantError("key is not set")
        return cert, key, ca


class FlightSqlConfig(_Model):
    """Flight SQL on the gateway's Flight port (docs/flight-sql.md)."""

    enabled: bool = Field(True, description="Serve Flight SQL commands beside the JSON tickets.")
    memory_limit_bytes: int = Field(
        1024 * MiB,
        ge=1 * MiB,
        description="Memory one query's operators may hold (aggregates, sorts, joins); a "
        "query that needs more fails with a message naming this setting.",
    )
    timeout_s: float = Field(
        300.0,
        gt=0,
        description="A query still running after this long ends with DEADLINE_EXCEEDED "
        "(checked between result batches).",
    )
    max_queries: int = Field(
        4, ge=1, description="Queries the gateway runs at once; more are refused UNAVAILABLE."
    )
    target_partitions: int | None = Field(
        None,
        ge=1,
        description="Threads one query's scan and operators use (None: the number of cores).",
    )


class FlightServingConfig(_Model):
    """How Flight serves: endpoint slicing, follow-stream lag, and per-caller limits."""

    slice_rows: int = Field(
        1_000_000, ge=1, description="A bounded read gets one endpoint per this many records."
    )
    follow_max_lag_records: int | None = Field(
        5_000_000,
        ge=1,
        description="A follow stream that, once caught up, falls this many records behind "
        "the partition's durable end ends with an error (None: never).",
    )
    segment_cache_bytes: int = Field(
        256 * MiB,
        ge=0,
        description="Recent lane segments kept in memory as Arrow (written or read), so hot "
        "do_get reads skip Parquet decoding; least recently used out first. 0: off.",
    )
    ipc_copy_bytes: int = Field(
        1024 * MiB,
        ge=0,
        description="Disk for uncompressed Arrow IPC copies of recent decoded segments, "
        "memory-mapped by reads the segment cache misses (no Parquet decoding); oldest "
        "out first. 0: off.",
    )
    max_streams_per_caller: int = Field(
        32, ge=1, description="Concurrent do_get/do_put calls one caller may hold."
    )
    max_put_bytes: int = Field(
        1 << 30, ge=1, description="Bytes one do_put call may send (Arrow buffer sizes)."
    )
    max_batch_bytes: int = Field(
        64 * MiB, ge=1, description="Largest single record batch a do_put may send."
    )
    sql: FlightSqlConfig = Field(default_factory=FlightSqlConfig)
