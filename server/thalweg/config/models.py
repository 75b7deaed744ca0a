"""The configuration schema. Every key, its default and why, in one place.

Models are frozen and refuse unknown keys, so a typo is an error at start, not a
silently ignored setting. ``docs/configuration.md`` mirrors this file.

Why one module of ~560 lines: it is the schema of one TOML document, read top to bottom
beside ``docs/configuration.md``; the models reference each other (a source's
``schema_limits``, the gateway's ``flight`` and ``auth``) and their cross-field rules, and
splitting by table would scatter the one place an operator looks up a key.

Its length: every section of the file is here (issue 36 splits it into gateway, flight
and source sections as ``config/sinks.py`` already is; ``models`` will re-export).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from thalweg.config.kafka_security import KafkaSecurity
from thalweg.config.pipeline import PipelineConfig
from thalweg.config.retention import CompactionConfig, RetentionConfig
from thalweg.config.sinks import (
    FlightSinkConfig,
    IcebergSinkConfig,
    PostgresSinkConfig,
    RecoveryConfig,
    SinkConfig,
)
from thalweg.errors import InvariantError
from thalweg.records.columns import DEFAULT_PREFIX, MetadataColumns

MiB = 1 << 20


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _read_secret(path: Path, what: str) -> SecretStr:
    try:
        return SecretStr(path.read_text(encoding="utf-8").strip())
    except OSError as exc:
        raise ValueError(f"cannot read {what} file {str(path)!r}: {exc.strerror}") from exc


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


class TracingConfig(_Model):
    """OpenTelemetry traces, exported over OTLP/HTTP; off while ``otlp_endpoint`` is unset."""

    otlp_endpoint: str | None = Field(
        None, description="e.g. http://127.0.0.1:4318/v1/traces (unset: tracing off)."
    )
    service_name: str = "thalweg"
    sample_ratio: float = Field(1.0, ge=0, le=1, description="Share of root traces kept.")


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


class ObjectStoreConfig(_Model):
    """An S3-compatible object store holding the lanes (``data_dir = "s3://bucket/prefix"``).

    The store is the durable, shared tier: a segment is durable when its PUT returned,
    and only then is the position committed. ``cache_dir`` is the local staging and
    read cache of every lane (docs/lanes.md, "Object-store lanes").
    """

    url: str | None = Field(
        None, description="s3://bucket/prefix (set by writing it as gateway.data_dir)."
    )
    endpoint_url: str | None = Field(
        None, description="The S3 endpoint (http(s)://host:port); AWS's when unset."
    )
    region: str = Field("us-east-1", description="The bucket's region.")
    access_key_id: str | None = Field(
        None, description="Access key; the environment's credentials when unset."
    )
    secret_access_key: SecretStr | None = Field(None, description="Secret key (redacted).")
    cache_dir: Path = Field(
        Path("./twg-cache"),
        description="Local staging and read cache of the lanes (a segment is written here, "
        "then PUT; other members' segments are fetched here to be served).",
    )
    sync_interval_s: float = Field(
        1.0,
        gt=0,
        description="How often a replica fetches the segments other members wrote (its "
        "reads of their partitions' history are this fresh).",
    )

    @field_validator("url")
    @classmethod
    def _s3_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        scheme, sep, rest = v.partition("://")
        if scheme != "s3" or not sep or not rest.split("/", 1)[0]:
            raise ValueError("must look like s3://bucket or s3://bucket/prefix")
        return v.rstrip("/")


class GatewayConfig(_Model):
    """Process-wide settings."""

    data_dir: Path = Field(Path("./twg-data"), description="Root of the raw and decoded lanes.")
    shared_data_dir: bool = Field(
        False,
        description="Every gateway of the consumer group writes this one data_dir (a "
        "ReadWriteMany volume): any replica then serves every partition's history, and "
        "sends only follow reads to a partition's owner. False: each replica has its own "
        "data_dir and sends every read of a partition it does not own to its owner.",
    )
    flight_listen: str = Field(
        "grpc://127.0.0.1:8815", description="Where the Flight server listens (grpc://host:port)."
    )
    flight_advertise: str | None = Field(
        None, description="Location put in Flight endpoints; defaults to flight_listen."
    )
    http_listen: str = Field("127.0.0.1:8080", description="host:port of the admin HTTP server.")
    metadata_prefix: str = Field(DEFAULT_PREFIX, description="Prefix of the metadata columns.")
    gc_tuning: bool = Field(
        True,
        description="Raise the GC threshold and freeze start-up objects (2x ingest rate).",
    )
    auth: FlightAuthConfig | None = Field(
        None, description="Tokens, users and per-topic permissions for Flight callers."
    )
    tls: FlightTlsConfig | None = Field(
        None, description="TLS (or mutual TLS) for Flight; needs flight_listen grpc+tls://."
    )
    flight: FlightServingConfig = Field(default_factory=FlightServingConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    metrics_enabled: bool = Field(
        True, description="Serve /metrics (Prometheus); false answers 404 there."
    )
    stall_after_s: float = Field(
        10.0,
        gt=0,
        description="/stats names a stage stalled when work has waited for it this long "
        "with nothing finished.",
    )
    put_timeout_ms: int = Field(
        30_000,
        gt=0,
        description="How long do_put waits for the broker to acknowledge a batch before "
        "the put fails (saying how many rows were produced).",
    )
    shutdown_timeout_s: float = Field(
        25.0,
        gt=0,
        description="On SIGTERM/SIGINT: stop fetching, flush, commit and leave the group "
        "within this long; after it, what is left is abandoned uncommitted (exit code 3).",
    )
    idempotent_producer: bool = Field(
        False,
        description="do_put produces with Kafka's idempotent producer (needs broker "
        "support; tansu has none).",
    )
    role: Literal["ingest", "recovery", "both"] = Field(
        "both",
        description="ingest: consume into the lanes only; recovery: feed the sinks from "
        "the lanes only (a backfill on its own pod, same data_dir); both (default).",
    )

    object_store: ObjectStoreConfig = Field(
        default_factory=ObjectStoreConfig,
        description="Where an s3:// data_dir lives, and its local cache.",
    )

    @model_validator(mode="before")
    @classmethod
    def _object_store_data_dir(cls, data: object) -> object:
        """``data_dir = "s3://bucket/prefix"`` puts the lanes in an object store; the
        local side of every lane is then ``object_store.cache_dir``."""
        if not isinstance(data, dict):
            return data
        where = data.get("data_dir")
        if isinstance(where, str) and where.startswith("s3://"):
            store = dict(data.get("object_store") or {})
            store["url"] = where
            data = {**data, "object_store": store}
            data["data_dir"] = store.get("cache_dir", "./twg-cache")
        return data

    @property
    def lanes_in_object_store(self) -> bool:
        return self.object_store.url is not None

    @model_validator(mode="after")
    def _tls_matches_scheme(self) -> GatewayConfig:
        tls_url = self.flight_listen.startswith("grpc+tls://")
        if self.tls is not None and not tls_url:
            raise ValueError("gateway.tls is set, so flight_listen must be grpc+tls://host:port")
        if self.tls is None and tls_url:
            raise ValueError("flight_listen is grpc+tls:// but gateway.tls is not set")
        return self

    @field_validator("flight_listen", "flight_advertise")
    @classmethod
    def _grpc_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        scheme, sep, rest = v.partition("://")
        if scheme not in ("grpc", "grpc+tcp", "grpc+tls") or not sep or ":" not in rest:
            raise ValueError("must look like grpc://host:port (or grpc+tls://host:port)")
        _port_in_range(rest.rpartition(":")[2])
        return v

    @field_validator("http_listen")
    @classmethod
    def _host_port(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError("must look like host:port")
        _port_in_range(port)
        return v

    @field_validator("metadata_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        MetadataColumns(v)  # raises ValueError with the rule
        return v


def _port_in_range(port: str) -> None:
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"port {port!r} is not a port number (0-65535; 0 picks a free one)")


class RawLaneConfig(_Model):
    """How the primary raw lane rolls and compresses its Parquet files.

    A file is closed when any limit is reached; the source position is committed only
    after the file is durable, so ``roll_age_s`` bounds how far commits lag ingest.
    """

    roll_rows: int = Field(500_000, gt=0, description="Close a file at this many rows.")
    roll_bytes: int = Field(
        64 * MiB, gt=0, le=1024 * MiB, description="Close a file at this many buffered bytes."
    )
    roll_age_s: float = Field(5.0, gt=0, description="Close a file this long after its first row.")
    max_buffered_bytes: int = Field(
        256 * MiB,
        gt=0,
        description="Pause fetching while this much is buffered and not yet durable.",
    )
    compression: Literal["zstd", "snappy", "lz4", "gzip", "none"] = "zstd"
    compression_level: int | None = Field(1, description="zstd/gzip level; 1 is fastest.")
    decoded_compression: Literal["zstd", "snappy", "lz4", "gzip", "none"] | None = Field(
        None,
        description="Codec of the decoded lane (default: as compression). lz4 reads about "
        "twice as fast as zstd-1 at twice the size: for topics read more than written.",
    )
    fsync: bool = Field(True, description="fsync files and directories (never off in production).")


class RegistryConfig(_Model):
    """Where Avro writer schemas come from: a Confluent-compatible registry or files."""

    url: str | None = Field(None, description="Registry base URL, e.g. http://registry:8081.")
    schemas_dir: Path | None = Field(None, description="A directory of <id>.avsc files instead.")
    username: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = Field(None, description="Bearer token (instead of basic auth).")
    ssl_cafile: Path | None = None
    timeout_s: float = Field(5.0, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> RegistryConfig:
        if (self.url is None) == (self.schemas_dir is None):
            raise ValueError("set exactly one of url and schemas_dir")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return self


class SchemaLimitsConfig(_Model):
    """What records may do to a topic's decoded schema (the defence against schema
    bombs). A record beyond a limit goes to the dead-letter lane as ``schema_limit`` and
    the schema stays as it was; a ``do_put`` whose columns are beyond them is refused."""

    max_columns: int = Field(
        1000,
        gt=0,
        description="Fields of the decoded schema, counted at every depth (a struct's "
        "children count).",
    )
    max_depth: int = Field(
        32, gt=0, description="Levels of nested objects and arrays; the record is level 1."
    )
    max_name_length: int = Field(256, gt=0, description="Characters of one field name.")
    max_new_fields_per_batch: int = Field(
        500, gt=0, description="Fields one fetched batch may add to the decoded schema."
    )


def _check_pattern(pattern: str | None) -> None:
    if pattern is None:
        return
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"topics_pattern {pattern!r} is not a regular expression: {exc}") from exc


class _SourceBase(_Model):
    """What every source has, whatever its transport: topics, how values decode, and
    the limits on what one poll may bring."""

    name: str = Field(min_length=1)
    topics: list[str] = Field(default_factory=list)
    format: Literal["json", "avro", "protobuf", "none"] = Field(
        "json", description="How the decoded lane reads record values ('none': raw lane only)."
    )
    registry: RegistryConfig | None = Field(
        None, description="Schema source for format = 'avro' (Confluent wire format)."
    )
    protobuf_descriptor_set: Path | None = Field(
        None,
        description="For format = 'protobuf': a FileDescriptorSet file (protoc "
        "--descriptor_set_out --include_imports) instead of a registry.",
    )
    json_schema: Path | None = Field(
        None,
        description="For format = 'json': a JSON Schema file that fixes the decoded columns "
        "(wins over inference; fields it does not name are ignored).",
    )
    cluster: str | None = Field(
        None, description="Cluster name stamped in the lane and record ids; defaults to name."
    )
    max_poll_records: int = Field(10_000, gt=0)
    max_record_bytes: int | None = Field(
        None,
        gt=0,
        description="Payloads larger than this are not decoded: they go to the dead-letter "
        "lane with reason 'oversize' (the raw lane keeps them whole). Unset: no limit.",
    )
    schema_limits: SchemaLimitsConfig = Field(
        default_factory=SchemaLimitsConfig,
        description="Bounds on the decoded schema: records beyond them are dead-lettered "
        "as 'schema_limit', do_put batches beyond them refused.",
    )
    contract: Path | None = Field(
        None,
        description="An ODCS v3 data contract (YAML): decoded records that break its schema "
        "or per-record quality rules go to the dead-letter lane with reason 'contract' or "
        "'quality'. The object whose physicalName (or name) is the topic applies; a "
        "contract with one object applies to every topic.",
    )
    registry_max_wait_s: float | None = Field(
        None,
        gt=0,
        description="How long records wait for an unreachable schema registry before they "
        "go to the dead-letter lane with reason 'retry_exhausted'. Unset: they wait (and "
        "fetching with them) until it answers.",
    )
    record_size_est_bytes: int = Field(
        1024,
        gt=0,
        description="Seed of the p95 record-size estimate that turns the byte budget "
        "into records per poll (learnt from traffic after the first fetch).",
    )
    max_records_per_s: float | None = Field(
        None, gt=0, description="Rate limit: records consumed per second (unset: none)."
    )
    max_bytes_per_s: float | None = Field(
        None, gt=0, description="Rate limit: key + value bytes consumed per second."
    )

    @property
    def cluster_name(self) -> str:
        return self.cluster or self.name

    def takes(self, topic: str) -> bool:
        """Whether this source consumes ``topic``: named in ``topics``, or matched whole
        by a ``topics_pattern`` (Kafka and Pulsar sources)."""
        if topic in self.topics:
            return True
        pattern = getattr(self, "topics_pattern", None)
        return isinstance(pattern, str) and re.fullmatch(pattern, topic) is not None

    def _check_common(self) -> None:
        if len(set(self.topics)) != len(self.topics):
            raise ValueError("topics: listed twice")
        for topic in self.topics:
            if not topic or "/" in topic or topic in {".", ".."}:
                raise ValueError(f"topics: {topic!r} is not a usable topic name")
        if self.json_schema is not None and self.format != "json":
            raise ValueError("json_schema applies to format = 'json' only")
        if self.contract is not None and self.format == "none":
            raise ValueError("contract needs a decoded lane: set format (json, avro, protobuf)")
        if self.format == "avro" and self.registry is None:
            raise ValueError(
                "format = 'avro' needs a [sources.registry] table (url or schemas_dir)"
            )


class KafkaSourceConfig(_SourceBase, KafkaSecurity):
    """A Kafka (or Kafka-compatible) source consumed in a consumer group with aiokafka.

    Its TLS and SASL fields are :class:`thalweg.config.kafka_security.KafkaSecurity`'s.
    """

    kind: Literal["kafka"] = "kafka"
    bootstrap_servers: str = Field(min_length=1)
    topics_pattern: str | None = Field(
        None,
        description="A regular expression over topic names, instead of topics: it must "
        "match the whole name. Topics created later are picked up at the next metadata "
        "refresh (metadata_max_age_ms).",
    )
    group_id: str = "thalweg"
    group_instance_id: str | None = Field(
        None,
        min_length=1,
        description="Static group membership (KIP-345): a name stable across restarts "
        "(in Kubernetes '${POD_NAME}'). A member that comes back within "
        "session_timeout_ms keeps its partitions — no rebalance, no moved follow streams — "
        "and a shutdown does not leave the group. Unique per gateway in the group.",
    )
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    session_timeout_ms: int = Field(10_000, gt=0)
    heartbeat_interval_ms: int = Field(3_000, gt=0)
    dlq_topic: str | None = Field(
        None,
        description="Also produce dead letters to this Kafka topic, with __twg.errors.* "
        "headers; the Parquet dlq/ lane is written either way.",
    )
    dlq_bootstrap_servers: str | None = Field(
        None,
        description="The cluster of dlq_topic (default: the source's); the source's "
        "security settings apply to it.",
    )
    dlq_topic_max_wait_s: float | None = Field(
        None,
        gt=0,
        description="How long a batch of dead letters is retried to dlq_topic before it is "
        "left in the dlq/ lane only (and the commit goes on). Unset: until it succeeds.",
    )
    on_divergence: Literal["stop", "new_epoch"] = Field(
        "stop",
        description="When a partition's broker log no longer continues its lane (topic "
        "recreated, broker data lost, restored from backup, retention past the lane's end): "
        "'stop' holds the partition (health names it, /ready 503) until the operator acts; "
        "'new_epoch' closes the lane's epoch and starts a new one at the broker's log start "
        "(docs/lanes.md).",
    )
    request_timeout_ms: int = Field(
        40_000,
        gt=0,
        description="How long a broker request may take; also how long start-up waits for "
        "a configured topic to appear before the source reports it missing.",
    )
    missing_topic_grace_s: float = Field(
        30.0,
        gt=0,
        description="How long a configured topic may be missing on the broker before "
        "/ready turns 503 (/health names it from the first check).",
    )
    metadata_max_age_ms: int = Field(
        30_000,
        ge=1_000,
        description="How often the cluster's metadata is refreshed: partitions added to "
        "a topic are assigned and consumed from their first offset within this (aiokafka's "
        "default, 5 minutes, left new partitions unread that long).",
    )
    fetch_max_bytes: int = Field(50 * MiB, gt=0)
    max_partition_fetch_bytes: int = Field(8 * MiB, gt=0)
    produce_compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "none",
        description="Codec of the record batches do_put produces into this cluster. "
        "'none' is fastest on a local network; lz4 or zstd send less over a slow link "
        "(a batch that does not shrink is sent as it is).",
    )
    fetch_max_wait_ms: int = Field(
        50,
        ge=0,
        le=60_000,
        description="How long the broker may hold a fetch for data to arrive. It bounds "
        "the live tail's latency on a quiet or steady topic (tansu holds a fetch this "
        "long whatever arrives: 500 ms, the client's default, gave follow streams a p50 "
        "of 130 ms and a p99 of 270 ms); an idle source asks this often.",
    )

    @model_validator(mode="after")
    def _check(self) -> KafkaSourceConfig:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be below session_timeout_ms")
        if bool(self.topics) == (self.topics_pattern is not None):
            raise ValueError("name either topics or a topics_pattern (one of them)")
        _check_pattern(self.topics_pattern)
        self._check_common()
        self.check_security()
        return self


class PulsarSourceConfig(_SourceBase):
    """A Pulsar source: one subscription through the official pulsar-client.

    Topics are short names in ``tenant``/``namespace``; a partitioned topic is read
    partition by partition into the lane of its own name. ``exclusive`` and ``failover``
    subscriptions acknowledge cumulatively, ``shared`` and ``key_shared`` one message at
    a time — always after the raw lane holding the message is durable.
    """

    kind: Literal["pulsar"]
    service_url: str = Field(
        min_length=1, description="pulsar:// or pulsar+ssl:// URL of the brokers."
    )
    tenant: str = Field("public", pattern=r"^[A-Za-z0-9_.=-]+$")
    namespace: str = Field("default", pattern=r"^[A-Za-z0-9_.=-]+$")
    topics_pattern: str | None = Field(
        None,
        description="A regex over short topic names in tenant/namespace, instead of "
        "topics. Needs a broker that supports regex subscriptions.",
    )
    subscription: str = Field("thalweg", min_length=1)
    subscription_type: Literal["exclusive", "failover", "shared", "key_shared"] = "failover"
    initial_position: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a new subscription starts."
    )
    receiver_queue_size: int = Field(
        1000,
        gt=0,
        description="Messages the client prefetches per partition: with the buffer bound, "
        "the most a paused source holds in memory.",
    )
    auth_token: SecretStr | None = Field(None, description="JWT for token authentication.")
    tls_trust_certs_file: Path | None = None
    operation_timeout_s: float = Field(30.0, gt=0)

    @property
    def namespace_prefix(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/"

    @model_validator(mode="after")
    def _check(self) -> PulsarSourceConfig:
        if bool(self.topics) == (self.topics_pattern is not None):
            raise ValueError("name either topics or a topics_pattern (one of them)")
        _check_pattern(self.topics_pattern)
        if not self.service_url.startswith(("pulsar://", "pulsar+ssl://")):
            raise ValueError("service_url must start with pulsar:// or pulsar+ssl://")
        self._check_common()
        return self


FileFormat = Literal["auto", "parquet", "csv", "tsv", "jsonl", "avro", "arrow", "excel"]


class TypedSourceConfig(_SourceBase):
    """What sources whose rows arrive typed share (files, Arrow IPC drops, a Flight
    stream): one lane topic, rows decoded by admitting their columns, and a state
    directory where their positions are committed."""

    topics: list[str] = Field(
        min_length=1, max_length=1, description="The one lane topic the files' rows go to."
    )
    max_poll_records: int = Field(
        256 * 1024, gt=0, description="Rows handed on per fetch (a file is read in chunks)."
    )
    state_dir: Path | None = Field(
        None,
        description="Where the manifest lives (default: <data_dir>/batch/<topic> for "
        "files, <data_dir>/sources/<name> for arrow_ipc).",
    )

    def _check_files(self) -> None:
        if "format" in self.model_fields_set:
            raise ValueError(
                "sources of files read typed rows: their format is the files' own, not format"
            )
        if self.registry is not None or self.json_schema is not None:
            raise ValueError("sources of files take their schema from the files (no registry)")
        self._check_common()


class FilesSourceConfig(TypedSourceConfig):
    """Files read by ``twg batch`` (docs/batch.md): each file's rows go through the same
    decoded lane, contract, dead-letter lane, pipeline and sinks as a topic's records.
    A file is one partition of ``topics[0]``; its row numbers are the positions."""

    kind: Literal["files"]
    paths: list[str] = Field(
        default_factory=list,
        description="Files, directories or globs (local, or s3://...) read when the "
        "command line names none.",
    )
    file_format: FileFormat = Field(
        "auto", description="Format of every file; 'auto': from each file's suffix."
    )
    csv_delimiter: str = Field(",", min_length=1, max_length=1)
    csv_header: bool = Field(True, description="The first CSV record names the columns.")
    csv_quote: str = Field(
        '"',
        max_length=1,
        description="The CSV quote character; a quote inside a quoted value is doubled. "
        "'': no quoting (a quote is an ordinary character). Backslash escapes are not read.",
    )
    csv_null_values: list[str] | None = Field(
        None,
        description="CSV cells read as null, in every column, strings too. Unset: "
        "pyarrow's list ('', NULL, NA, N/A, null, NaN, ...) for typed columns; string "
        "columns keep their text.",
    )

    @model_validator(mode="after")
    def _check(self) -> FilesSourceConfig:
        self._check_files()
        if self.csv_quote and self.csv_quote == self.csv_delimiter:
            raise ValueError("csv_quote and csv_delimiter must differ")
        if {self.csv_quote, self.csv_delimiter} & {"\n", "\r"}:
            raise ValueError("csv_quote and csv_delimiter cannot be a line break")
        if self.csv_quote == "\t":
            raise ValueError("csv_quote cannot be a tab (the delimiter of .tsv files)")
        if not (self.csv_quote + self.csv_delimiter).isascii():
            raise ValueError("csv_quote and csv_delimiter must be ASCII characters")
        return self


class ArrowIpcSourceConfig(TypedSourceConfig):
    """Arrow IPC files dropped into a directory, read by ``twg stream`` as they appear
    (docs/batch.md, "Arrow IPC drops"): each file is a partition of ``topics[0]``."""

    kind: Literal["arrow_ipc"]
    directory: str = Field(min_length=1, description="A local directory, or a URI (s3://...).")
    pattern: str = Field("*.arrow*", description="File names read (a glob).")
    poll_interval_s: float = Field(1.0, gt=0, description="How often the directory is listed.")
    settle_s: float = Field(
        1.0,
        ge=0,
        description="A file is read once its size and modification time have not changed "
        "for this long (write files under another name and rename them to be safe at 0).",
    )

    @model_validator(mode="after")
    def _check(self) -> ArrowIpcSourceConfig:
        self._check_files()
        return self


class FlightSourceConfig(TypedSourceConfig):
    """Another Thalweg gateway's topic, followed over Flight ``do_get`` (docs/batch.md,
    "Flight"): each upstream partition is a partition here, its positions the same."""

    kind: Literal["flight"]
    location: str = Field(
        min_length=1, description="The upstream gateway: grpc://host:port or grpc+tls://..."
    )
    upstream_topic: str | None = Field(
        None, description="The upstream topic (default: this source's topic)."
    )
    token: SecretStr | None = Field(None, description="Bearer token for the upstream.")
    tls_root_certs: Path | None = Field(None, description="CA bundle for grpc+tls://.")
    retry_s: float = Field(1.0, gt=0, description="Wait before reconnecting a broken stream.")

    @model_validator(mode="after")
    def _check(self) -> FlightSourceConfig:
        if not self.location.startswith(("grpc://", "grpc+tcp://", "grpc+tls://")):
            raise ValueError("location must start with grpc://, grpc+tcp:// or grpc+tls://")
        self._check_files()
        return self


SourceConfig = Annotated[
    KafkaSourceConfig
    | PulsarSourceConfig
    | FilesSourceConfig
    | ArrowIpcSourceConfig
    | FlightSourceConfig,
    Field(discriminator="kind"),
]
# A source with a broker behind it: what ``twg stream`` consumes and ``do_put`` produces to.
BrokerSourceConfig = KafkaSourceConfig | PulsarSourceConfig


class ThalwegConfig(_Model):
    """The whole file."""

    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    raw_lane: RawLaneConfig = Field(default_factory=RawLaneConfig)
    sources: list[SourceConfig] = Field(min_length=1)
    sinks: list[SinkConfig] = Field(default_factory=list)
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)

    @model_validator(mode="after")
    def _pipeline(self) -> ThalwegConfig:
        """Every node reads a consumed topic or a node — a topic with a decoded lane —
        and feeds a configured sink."""
        source_of = self.source_of
        nodes = {n.name: n for n in self.pipeline.nodes}
        sinks = {s.name for s in self.sinks}
        for node in self.pipeline.nodes:
            where = f"pipeline.nodes.{node.name}"
            if source_of(node.name) is not None:
                raise ValueError(f"{where}: a node cannot share a topic's name")
            if node.from_ not in nodes and source_of(node.from_) is None:
                raise ValueError(
                    f"{where}: from = {node.from_!r} is neither a consumed topic nor a node"
                )
            if node.sink is not None and node.sink not in sinks:
                raise ValueError(f"{where}: sink = {node.sink!r} is not a [[sinks]] name")
            root = node.from_
            while root in nodes:
                root = nodes[root].from_
            source = source_of(root)
            if source is not None and source.format == "none":
                raise ValueError(
                    f"{where}: topic {root!r} has no decoded lane (its source has format = "
                    '"none"); nodes transform decoded records'
                )
        fed: dict[str, str] = {}
        by_name = nodes
        for node in self.pipeline.nodes:
            if node.sink is None:
                continue
            where = f"pipeline.nodes.{node.name}"
            if node.sink in fed:
                raise ValueError(
                    f"{where}: sink {node.sink!r} is already fed by node {fed[node.sink]!r}"
                )
            fed[node.sink] = node.name
            root = node.from_
            while root in by_name:
                root = by_name[root].from_
            sink = next(s for s in self.sinks if s.name == node.sink)
            if sink.topics != [root]:
                raise ValueError(
                    f"{where}: sink {node.sink!r} must have topics = [{root!r}], the topic "
                    "the node derives from (its positions are that topic's)"
                )
            if sink.raw:
                raise ValueError(f"{where}: a node's sink receives derived rows, not raw = true")
        return self

    @model_validator(mode="after")
    def _sinks(self) -> ThalwegConfig:
        """A sink needs recovery, a lane to read, and a unique name."""
        names = [s.name for s in self.sinks]
        if len(set(names)) != len(names):
            raise ValueError("sinks: two sinks share a name")
        if self.sinks and not self.recovery.enabled:
            raise ValueError(
                "sinks: a secondary sink needs recovery (recovery.enabled = true): without "
                "the replay from the raw lane, a sink that is down loses what it missed"
            )
        for sink in self.sinks:
            for topic in sink.topics:
                source = self.source_of(topic)
                if source is None:
                    raise ValueError(
                        f"sinks.{sink.name}: topic {topic!r} is not consumed by any source"
                    )
                if source is not None and source.format == "none" and not sink.raw:
                    raise ValueError(
                        f"sinks.{sink.name}: topic {topic!r} has no decoded lane (its source "
                        'has format = "none"); set raw = true to send the raw lane'
                    )
        return self

    @model_validator(mode="after")
    def _unique(self) -> ThalwegConfig:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError("sources: two sources share a name")
        seen: dict[str, str] = {}
        for source in self.sources:
            for topic in source.topics:
                if topic in seen:
                    raise ValueError(
                        f"sources: topic {topic!r} is consumed by both {seen[topic]!r} and "
                        f"{source.name!r}; one lane per topic name"
                    )
                seen[topic] = source.name
        return self

    def source_of(self, topic: str) -> SourceConfig | None:
        """The source consuming ``topic``: one naming it, or a Pulsar source whose
        ``topics_pattern`` matches the whole name."""
        for s in self.sources:
            if topic in s.topics:
                return s
        for s in self.sources:
            if s.takes(topic):
                return s
        return None

    def secrets(self) -> list[str]:
        """Dotted paths of every configured secret (values never shown)."""
        out = []
        if self.gateway.auth is not None:
            out += [f"gateway.auth.tokens.{i}.token" for i in range(len(self.gateway.auth.tokens))]
            out += [f"gateway.auth.users.{i}.password" for i in range(len(self.gateway.auth.users))]
        for i, source in enumerate(self.sources):
            if isinstance(source, KafkaSourceConfig):
                out += [f"sources.{i}.{name}" for name in source.security_secrets()]
            if isinstance(source, PulsarSourceConfig) and source.auth_token is not None:
                out.append(f"sources.{i}.auth_token")
            if isinstance(source, FlightSourceConfig) and source.token is not None:
                out.append(f"sources.{i}.token")
            reg = source.registry
            if reg is not None and reg.password is not None:
                out.append(f"sources.{i}.registry.password")
            if reg is not None and reg.token is not None:
                out.append(f"sources.{i}.registry.token")
        for i, sink in enumerate(self.sinks):
            if isinstance(sink, PostgresSinkConfig):
                out.append(f"sinks.{i}.dsn")
            if isinstance(sink, FlightSinkConfig) and sink.token is not None:
                out.append(f"sinks.{i}.token")
            if isinstance(sink, IcebergSinkConfig):
                if sink.catalog.token is not None:
                    out.append(f"sinks.{i}.catalog.token")
                out += [
                    f"sinks.{i}.catalog.secret_properties.{k}"
                    for k in sink.catalog.secret_properties
                ]
        return out
