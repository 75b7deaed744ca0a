"""``[[sources]]``: Kafka, Pulsar, files, Arrow IPC and upstream Flight sources, with the
schema registry and the limits they decode under.

Its length: the five source kinds share ``_SourceBase`` (topics, decoding, limits) and
the ``SourceConfig`` union that picks one by ``kind`` names them all; a kind's keys are
read top to bottom beside ``docs/configuration.md``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, model_validator

from thalweg.config.common import MiB, _Model
from thalweg.config.kafka_security import KafkaSecurity


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
    envelope: Literal["none", "debezium"] = Field(
        "none",
        description="'debezium': values are Debezium change events (JSON, with or without "
        "the schema/payload wrapper, or Avro); the decoded lane holds the row each names "
        "with __op, __deleted, __source and __ts_ms (docs/cdc.md).",
    )
    unavailable_value: str = Field(
        "__debezium_unavailable_value",
        min_length=1,
        description="With envelope = 'debezium': what the connector sends for a value it "
        "could not read (its unavailable.value.placeholder; also as bytes, base64 text and "
        "a one-element array). Such a value never lands: the cell is null, __unavailable "
        "names the column, and upsert sinks and the latest view keep the key's current "
        "value (docs/cdc.md).",
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

    @property
    def topic_pattern(self) -> str | None:
        """The ``topics_pattern`` of a source that has one."""
        pattern = getattr(self, "topics_pattern", None)
        return pattern if isinstance(pattern, str) else None

    def takes(self, topic: str) -> bool:
        """Whether this source consumes ``topic``: named in ``topics``, or matched whole
        by a ``topics_pattern`` (Kafka and Pulsar sources)."""
        if topic in self.topics:
            return True
        return (
            self.topic_pattern is not None and re.fullmatch(self.topic_pattern, topic) is not None
        )

    def _check_common(self) -> None:
        if len(set(self.topics)) != len(self.topics):
            raise ValueError("topics: listed twice")
        for topic in self.topics:
            if not topic or "/" in topic or topic in {".", ".."}:
                raise ValueError(f"topics: {topic!r} is not a usable topic name")
        if self.json_schema is not None and self.format != "json":
            raise ValueError("json_schema applies to format = 'json' only")
        if self.envelope == "debezium" and self.format not in ("json", "avro"):
            raise ValueError("envelope = 'debezium' reads JSON or Avro events: set format")
        if self.envelope == "debezium" and self.json_schema is not None:
            raise ValueError(
                "envelope = 'debezium' infers the row from the events (no json_schema)"
            )
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
    leave_group_on_stop: Literal["always", "unless_leader"] = Field(
        "unless_leader",
        description="Without group_instance_id: whether a stopping gateway sends "
        "LeaveGroup (its partitions move at once) when it leads the group. "
        "'unless_leader': a leader with other members lets its session time out instead "
        "(a leader alone leaves) — tansu keeps a leader that leaves mid-rebalance and "
        "the group is never assigned again (ADR 0039); the cost is session_timeout_ms "
        "before the leader's partitions move. 'always': for Kafka clusters.",
    )
    static_hold_ms: int | None = Field(
        None,
        ge=0,
        description="With group_instance_id: how long the group keeps a departed static "
        "member's partitions unassigned for it when the broker rebalances without it "
        "(tansu does when a restarted member was the leader; Kafka waits "
        "session_timeout_ms before any rebalance). Its return then moves nothing; past "
        "it, a rebalance hands them to the members present. Default: session_timeout_ms, "
        "at least 30 s (a restart plus the broker's join rounds: tansu took 10 s to take "
        "a restarted leader back); 0 hands them over at once.",
    )

    def static_hold_s(self) -> float:
        """``static_hold_ms`` in seconds, its default resolved."""
        if self.static_hold_ms is not None:
            return self.static_hold_ms / 1000
        return max(self.session_timeout_ms, 30_000) / 1000

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
        if self.envelope != "none":
            raise ValueError("sources of files read rows, not change events (no envelope)")
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
