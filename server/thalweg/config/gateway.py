"""``[gateway]``: the service itself — its data_dir (local or an object store), ports,
tracing, and how the raw lane is written."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from thalweg.config.common import MiB, _Model
from thalweg.config.flight import (
    FlightAuthConfig,
    FlightServingConfig,
    FlightTlsConfig,
)
from thalweg.records.columns import DEFAULT_PREFIX, MetadataColumns


class TracingConfig(_Model):
    """OpenTelemetry traces, exported over OTLP/HTTP; off while ``otlp_endpoint`` is unset."""

    otlp_endpoint: str | None = Field(
        None, description="e.g. http://127.0.0.1:4318/v1/traces (unset: tracing off)."
    )
    service_name: str = "thalweg"
    sample_ratio: float = Field(1.0, ge=0, le=1, description="Share of root traces kept.")


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
    orphan_age_s: float = Field(
        120.0,
        gt=0,
        description="How long a decoded or dead-letter object whose raw object is not in "
        "the bucket (a publish cut off between its PUTs) is seen so before the owner "
        "removes it. Longer than any member takes between a twin's PUT and its raw one.",
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
