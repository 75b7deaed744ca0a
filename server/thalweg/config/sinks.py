"""The ``[[sinks]]`` tables and ``[recovery]``: secondary destinations and their replay.

A sink is secondary (ADR-0012 in the seed plan): it never holds the source commit and
is restored from the raw lane when it falls behind, so a sink cannot be configured with
recovery switched off. Each kind's options are its own model (``kind`` selects it);
``docs/sinks.md`` and ``docs/configuration.md`` mirror this file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

_NAME = r"^[A-Za-z0-9_.-]+$"
# day(col), hour(col), month(col), year(col), identity(col), bucket(N, col), truncate(N, col)
_TRANSFORM = (
    r"^(day|hour|month|year|identity)\(\s*\w+\s*\)$|^(bucket|truncate)\(\s*\d+\s*,\s*\w+\s*\)$"
)


# A {name} in a sink's table name: the topic, or a column of each row.
TEMPLATE_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# The record key's column under the default metadata prefix: an upsert sink's key when
# none is configured (a sink asks ``row_key`` with its gateway's own name for it).
RECORD_KEY = "_twg_source_key"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _SinkBase(_Model):
    name: str = Field(min_length=1, pattern=_NAME, description="Unique; in metrics and /health.")
    topics: list[str] = Field(min_length=1, description="Topics whose lane this sink receives.")
    raw: bool = Field(
        False, description="Receive the raw lane (payload bytes) instead of the decoded lane."
    )
    commit_interval_s: float = Field(
        30.0, gt=0, description="Flush (commit) at most this often while rows arrive."
    )
    max_buffered_rows: int = Field(
        500_000, gt=0, description="Flush earlier once this many rows wait in memory."
    )
    commit_rows: int | None = Field(
        None,
        gt=0,
        description="Commit once this many rows wait, before commit_interval_s (fewer, "
        "larger files from a busy topic). Unset: only the interval and max_buffered_rows.",
    )
    commit_bytes: int | None = Field(
        None,
        gt=0,
        description="Commit once the waiting rows hold this many bytes (Arrow), whichever "
        "of the interval, commit_rows and commit_bytes comes first.",
    )
    metadata: list[str] = Field(
        default_factory=lambda: ["source_timestamp", "source_key", "ingest_ts"],
        description="Raw-lane metadata columns (without the prefix) added to decoded rows, "
        "which carry only the locator columns themselves.",
    )
    on_refused: Literal["dead_letter", "stop"] = Field(
        "dead_letter",
        description="A record whose values the destination refuses for good (a NUL in a "
        "Postgres text, a uint64 past 2**63-1): 'dead_letter' sets it aside in the sink's "
        "dead-letter lane (data_dir/refused/<sink>/, reason sink_refused) and the sink moves "
        "on; 'stop' leaves the sink degraded at it until a person looks. Outages always wait.",
    )

    def read_metadata(self) -> list[str]:
        """The raw metadata columns this sink's rows are read with: ``metadata``, and
        what its mode needs besides (:meth:`Upserts.read_metadata`)."""
        return list(self.metadata)

    @field_validator("metadata")
    @classmethod
    def _known_metadata(cls, value: list[str]) -> list[str]:
        from thalweg.records.columns import SOURCE_COLUMNS, STAMPED_COLUMNS

        known = {f"source_{n}" for n, _ in SOURCE_COLUMNS} | {n for n, _ in STAMPED_COLUMNS}
        unknown = [v for v in value if v not in known]
        if unknown:
            raise ValueError(
                f"metadata: unknown column(s) {unknown}; known: {', '.join(sorted(known))}"
            )
        return value


class IcebergCatalogConfig(_Model):
    """A pyiceberg catalog. The embedded default is a SQL catalog on SQLite with a
    local warehouse, both under ``data_dir/sinks/<name>/``."""

    type: Literal["sql", "rest", "glue"] = "sql"
    uri: str | None = Field(
        None,
        description="sql: an SQLAlchemy URL; rest: the catalog's base URL; glue: unused "
        "(the region and endpoint are properties: glue.region, glue.endpoint).",
    )
    warehouse: str | None = Field(None, description="file:///… or s3://bucket/prefix.")
    token: SecretStr | None = Field(None, description="Bearer token of a REST catalog.")
    credential: SecretStr | None = Field(
        None,
        description="A REST catalog's OAuth2 client credentials, '<client_id>:<secret>', "
        "exchanged for a token at the catalog's token endpoint (properties: "
        "oauth2-server-uri, scope).",
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="Passed to pyiceberg as they are, e.g. s3.endpoint, s3.region.",
    )
    secret_properties: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Like properties, never shown: s3.access-key-id, s3.secret-access-key.",
    )


class Upserts(_SinkBase):
    """``mode`` and ``key``: the sinks that can keep one row per key (docs/cdc.md)."""

    mode: Literal["append", "upsert"] = Field(
        "append",
        description="'append': every record a row. 'upsert': one row per key, the newest "
        "by lane position; a change event's delete (__deleted) or, keyed by the record "
        "key, a tombstone (a null value) removes it (docs/cdc.md).",
    )
    key: list[str] = Field(
        default_factory=list,
        description="The columns naming a row (mode = 'upsert'). Empty: the record key "
        "(_twg_source_key, the bytes the producer sent), as in a compacted changelog.",
    )

    @property
    def record_keyed(self) -> bool:
        """``mode = "upsert"`` without ``key``: rows are named by the record key."""
        return self.mode == "upsert" and not self.key

    def row_key(self, record_key: str = RECORD_KEY) -> list[str]:
        """The columns an upsert folds by: ``key``, or the record key's column
        (``record_key``: its name under the gateway's metadata prefix)."""
        return list(self.key) if self.key else [record_key]

    def read_metadata(self) -> list[str]:
        """Keyed by the record key, the rows carry it and the value (a null value is a
        delete; the sink drops the value's bytes unless ``metadata`` asks for them)."""
        extra = ["source_key", "source_value"] if self.record_keyed else []
        return [*self.metadata, *(m for m in extra if m not in self.metadata)]

    @model_validator(mode="after")
    def _key_in_upsert_mode(self) -> Upserts:
        if self.key and self.mode != "upsert":
            raise ValueError(f"sinks.{self.name}: key applies to mode = 'upsert' only")
        if len(set(self.key)) != len(self.key):
            raise ValueError(f"sinks.{self.name}: key names a column twice")
        if self.mode == "upsert" and self.raw:
            raise ValueError(
                f"sinks.{self.name}: mode = 'upsert' folds decoded rows; set raw = false"
            )
        return self


class Routed(Upserts):
    """``table`` as a template and ``max_tables``: the sinks that can route one topic into
    many tables (docs/cdc.md, "One topic, many tables")."""

    table: str = Field(
        "{topic}",
        description="Table name; {topic} is replaced, and {field} by each row's value of "
        "that column ('{tenant}_orders': a table per tenant, made on first sight).",
    )
    max_tables: int = Field(
        100,
        gt=0,
        description="With a {field} in table: at most this many tables; rows for one more "
        "are refused into the sink's dead-letter lane (reason named).",
    )

    @model_validator(mode="after")
    def _tombstones_name_a_table(self) -> Routed:
        if self.record_keyed and any(f != "topic" for f in TEMPLATE_FIELD.findall(self.table)):
            raise ValueError(
                f"sinks.{self.name}: table {self.table!r} routes by a field, and a tombstone "
                "(a null value) has none: keyed by the record key, its delete would name no "
                "table; set key = [...] (with an envelope) or route by {topic} only"
            )
        return self

    @field_validator("table")
    @classmethod
    def _template(cls, value: str) -> str:
        fields = TEMPLATE_FIELD.findall(value)
        if not TEMPLATE_FIELD.sub("", value).replace("{", "").replace("}", "") and not fields:
            raise ValueError("table is empty")
        if value.count("{") != len(fields) or value.count("}") != len(fields):
            raise ValueError(f"table {value!r}: a brace that names no field")
        return value


class IcebergSinkConfig(Routed):
    kind: Literal["iceberg"]
    catalog: IcebergCatalogConfig = Field(default_factory=IcebergCatalogConfig)
    namespace: str = Field("thalweg", min_length=1)
    partition_by: list[str] = Field(
        default_factory=list,
        description='Partition transforms, e.g. ["day(_twg_source_timestamp)"].',
    )

    @model_validator(mode="after")
    def _one_table_per_topic(self) -> IcebergSinkConfig:
        if len(self.topics) > 1 and not TEMPLATE_FIELD.findall(self.table):
            raise ValueError(
                f"sinks.{self.name}: table {self.table!r} has no {{topic}} (nor a {{field}}) "
                "but the sink receives several topics; one Iceberg table per topic"
            )
        return self

    @field_validator("partition_by")
    @classmethod
    def _transforms(cls, value: list[str]) -> list[str]:
        import re

        for t in value:
            if not re.match(_TRANSFORM, t.strip()):
                raise ValueError(
                    f"partition_by: {t!r} is not day|hour|month|year|identity(column) or "
                    "bucket|truncate(N, column)"
                )
        return value


class PostgresSinkConfig(Routed):
    kind: Literal["postgres"]
    dsn: SecretStr = Field(description="postgresql://user:password@host:port/database")
    schema_name: str = Field("public", min_length=1)


class ArrowIpcSinkConfig(_SinkBase):
    kind: Literal["arrow_ipc"]
    path: Path | None = Field(
        None,
        description="Directory of the files (default data_dir/sinks/<name>); a {field} "
        "names a column of the rows ('out/{tenant}': a directory per value).",
    )
    max_paths: int = Field(
        100,
        gt=0,
        description="With a {field} in path: at most this many directories; rows for one "
        "more are refused into the sink's dead-letter lane (reason named).",
    )

    @field_validator("path")
    @classmethod
    def _path_template(cls, value: Path | None) -> Path | None:
        text = str(value or "")
        fields = TEMPLATE_FIELD.findall(text)
        if text.count("{") != len(fields) or text.count("}") != len(fields):
            raise ValueError(f"path {text!r}: a brace that names no field")
        if "topic" in fields:
            raise ValueError(f"path {text!r}: the files are kept per topic already")
        return value


class DeltaSinkConfig(Routed):
    """A Delta Lake table per topic (``sinks/delta.py``, docs/sinks.md)."""

    kind: Literal["delta"]
    uri: str | None = Field(
        None,
        description="Where the tables are: a directory or file:// URL, or s3://bucket/prefix "
        "(default data_dir/sinks/<name>); a topic's table is <uri>/<table>.",
    )
    table: str = Field(
        "{topic}",
        description="The table's directory under uri; {topic} is replaced, and {field} by "
        "each row's value of that column ('{tenant}_orders': a table per tenant, made on "
        "first sight, the sink's control record in <uri>/_thalweg_coverage).",
    )
    storage_options: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="delta-rs object-store options (AWS_ENDPOINT_URL, AWS_REGION, "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ALLOW_HTTP, ...), kept secret.",
    )
    compact_every_commits: int = Field(
        100,
        ge=0,
        description="Small files bounded: every this many commits to a table, its small "
        "files are rewritten into large ones (OPTIMIZE, delta-rs optimize.compact) and the "
        "files no version within vacuum_retention_hours reads are removed (VACUUM); 0: "
        "never (compact and vacuum with your own jobs).",
    )
    vacuum_retention_hours: int = Field(
        168,
        ge=0,
        description="VACUUM keeps the files a version of the last this many hours reads "
        "(time travel and readers still on an older version); below Delta's own 168 it "
        "is applied as given.",
    )

    @field_validator("table")
    @classmethod
    def _one_directory(cls, value: str) -> str:
        if not value.strip() or "/" in value or value in (".", ".."):
            raise ValueError(f"table {value!r}: one directory name")
        return value

    @model_validator(mode="after")
    def _one_table_per_topic(self) -> DeltaSinkConfig:
        if len(self.topics) > 1 and not TEMPLATE_FIELD.findall(self.table):
            raise ValueError(
                f"sinks.{self.name}: table {self.table!r} names no {{topic}} or field but "
                "the sink receives several topics; one Delta table per topic"
            )
        return self


class FlightSinkConfig(_SinkBase):
    kind: Literal["flight"]
    location: str = Field(description="grpc://host:port or grpc+tls://host:port")
    path: str = Field(
        "{topic}",
        description='Descriptor path of do_put, parts split on "/"; {topic} is replaced '
        '(another Thalweg gateway: "topics/{topic}"), and {field} by each row\'s value of '
        'that column ("tenants/{tenant}": a put per value).',
    )
    max_paths: int = Field(
        100,
        gt=0,
        description="With a {field} in path: at most this many paths since start; rows for "
        "one more are refused into the sink's dead-letter lane (reason named).",
    )
    token: SecretStr | None = Field(None, description="Bearer token sent with every call.")
    timeout_s: float = Field(30.0, gt=0)

    @field_validator("path")
    @classmethod
    def _path_template(cls, value: str) -> str:
        fields = TEMPLATE_FIELD.findall(value)
        if value.count("{") != len(fields) or value.count("}") != len(fields):
            raise ValueError(f"path {value!r}: a brace that names no field")
        return value

    @field_validator("location")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if not value.startswith(("grpc://", "grpc+tcp://", "grpc+tls://")):
            raise ValueError("location must start with grpc://, grpc+tcp:// or grpc+tls://")
        return value


SinkConfig = Annotated[
    IcebergSinkConfig
    | PostgresSinkConfig
    | ArrowIpcSinkConfig
    | FlightSinkConfig
    | DeltaSinkConfig,
    Field(discriminator="kind"),
]


class RecoveryConfig(_Model):
    """The replay of sink gaps from the raw lane (docs/sinks.md, the runbook)."""

    enabled: bool = Field(
        True, description="Required by every sink: a sink without recovery loses records."
    )
    window_records: int = Field(
        200_000, gt=0, description="Positions read from the lane per replay window."
    )
    max_duty: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Share of wall time a catching-up replay may take (the rest is ingest's).",
    )
    poll_interval_s: float = Field(
        1.0, gt=0, description="How often a sink looks for new durable segments."
    )
    retry_max_s: float = Field(30.0, gt=0, description="Longest wait between tries of a down sink.")
    degraded_retry_s: float = Field(
        60.0,
        gt=0,
        description="How often a sink stopped by a schema change (degraded) tries again: "
        "it resumes from its coverage once the table was changed (docs/sinks.md).",
    )
    recheck_every_flushes: int = Field(
        100,
        ge=0,
        description="A sink that reads its rows back compares them with the lane when it "
        "opens and every this many flushes (and at most 5 % of the time), and feeds again "
        "the rows deleted behind the gateway's back (docs/sinks.md); 0: never. Each check "
        "reads the destination's locator columns and the lane's positions once.",
    )
    max_lag_records: int | None = Field(
        None,
        gt=0,
        description="Backpressure through the DAG: a source pauses while a sink or node lane "
        "fed from its topics lags by more than this many positions (resumes under 80 %); "
        "default: never (sinks fall behind visibly, the raw lane keeps the backlog).",
    )
