"""Iceberg through the catalogs users deploy: a REST catalog (``tests/iceberg_rest.py``)
that vends storage credentials and checks the caller, on moto with its IAM checks on.

* The sink writes with the credentials the catalog vends, never its own: it is given
  none, moto refuses any key it did not issue (``INITIAL_NO_AUTH_ACTION_COUNT`` set to 0
  once the users and roles exist), and keys of a role without the bucket are refused.
  Each flush loads the table, so it writes with keys vended at most a flush ago: the
  keys vended first stop working and the next flush still lands.
* The catalog's auth: a bearer token, OAuth2 client credentials, SigV4; a wrong one
  leaves the sink unavailable, named.
* A commit conflict (another writer commits between the sink's load and its commit) is
  retried from a fresh load; a writer of the same sink that landed part of the flush
  meanwhile does not make it land twice; a commit whose answer is lost
  (``CommitStateUnknown``) leads to no duplicate.

The same sink against Glue and the REST catalog runs the whole destination contract
(``test_destination_contract.py``: ``iceberg_glue``, ``iceberg_rest``). Each case ends
with ``twg verify``.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.helpers import feeder_pass, write_segment
from tests.iceberg_rest import IcebergRestCatalog, SigV4
from tests.moto_server import REGION, MotoServer
from thalweg.config import parse_config
from thalweg.config.models import ThalwegConfig
from thalweg.sinks.base import SinkUnavailableError, Span
from thalweg.sinks.iceberg import IcebergSink
from thalweg.verify import verify
from thalweg.verify.sinks import destination

pytestmark = pytest.mark.integration

TOPIC = "t"
BUCKET = "lake"
ACCOUNT = "123456789012"
ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def _bucket_policy(bucket: str) -> str:
    resources = [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]
    statement = {"Effect": "Allow", "Action": "s3:*", "Resource": resources}
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


@dataclass
class Cloud:
    """moto with IAM checks on: an admin user (the catalog's own keys) and roles the
    catalog vends keys of."""

    moto: MotoServer
    admin: dict[str, str]

    def client(self, service: str, **keys: str) -> Any:
        return boto3.client(
            service, endpoint_url=self.moto.endpoint, region_name=REGION, **(keys or self.admin)
        )

    def role(self, bucket: str) -> str:
        """A new role that may use ``bucket`` only; its ARN."""
        name = f"writer-{uuid.uuid4().hex[:8]}"
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}
            ],
        }
        iam = self.client("iam")
        iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))
        iam.put_role_policy(RoleName=name, PolicyName="lake", PolicyDocument=_bucket_policy(bucket))
        return f"arn:aws:iam::{ACCOUNT}:role/{name}"

    def vend(self, role: Callable[[], str]) -> Callable[[], dict[str, str]]:
        """Keys of ``role()`` from STS, new at every call, as a catalog vends them."""

        def vended() -> dict[str, str]:
            creds = self.client("sts").assume_role(
                RoleArn=role(), RoleSessionName="twg-sink", DurationSeconds=900
            )["Credentials"]
            return {
                "s3.access-key-id": creds["AccessKeyId"],
                "s3.secret-access-key": creds["SecretAccessKey"],
                "s3.session-token": creds["SessionToken"],
            }

        return vended


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    moto = MotoServer(tmp_path_factory.mktemp("moto-iam") / "moto.log")
    try:
        iam = boto3.client(
            "iam",
            endpoint_url=moto.endpoint,
            region_name=REGION,
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        iam.create_user(UserName="catalog")
        iam.put_user_policy(UserName="catalog", PolicyName="all", PolicyDocument=json.dumps(ALL))
        key = iam.create_access_key(UserName="catalog")["AccessKey"]
        admin = {
            "aws_access_key_id": key["AccessKeyId"],
            "aws_secret_access_key": key["SecretAccessKey"],
        }
        found = Cloud(moto, admin)
        for bucket in (BUCKET, "elsewhere"):
            found.client("s3").create_bucket(Bucket=bucket)
        # From here on every request needs keys IAM issued and allows.
        reset = urllib.request.Request(
            f"{moto.endpoint}/moto-api/reset-auth",
            data=b"0",
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        urllib.request.urlopen(reset, timeout=10).read()
        yield found
    finally:
        moto.stop()


def _catalog(cloud: Cloud, tmp: Path, **kwargs: Any) -> IcebergRestCatalog:
    (tmp / "rest").mkdir(exist_ok=True)
    storage = {
        "s3.endpoint": cloud.moto.endpoint,
        "s3.region": REGION,
        "s3.access-key-id": cloud.admin["aws_access_key_id"],
        "s3.secret-access-key": cloud.admin["aws_secret_access_key"],
    }
    warehouse = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"
    return IcebergRestCatalog(tmp / "rest", warehouse=warehouse, storage=storage, **kwargs)


@pytest.fixture
def rest(cloud: Cloud, tmp_path: Path) -> Iterator[IcebergRestCatalog]:
    role = cloud.role(BUCKET)
    cat = _catalog(cloud, tmp_path, vend=cloud.vend(lambda: role), token=uuid.uuid4().hex)
    try:
        yield cat
    finally:
        cat.stop()


def configure(tmp: Path, cat: IcebergRestCatalog, **catalog: Any) -> ThalwegConfig:
    """Sink ``s`` on the REST catalog, with no storage keys of its own."""
    given = {"token": cat.token} if cat.token else {}
    return parse_config(
        {
            "gateway": {"data_dir": str(tmp / "data")},
            "sources": [
                {
                    "name": "k",
                    "kind": "kafka",
                    "bootstrap_servers": "127.0.0.1:9",
                    "topics": [TOPIC],
                }
            ],
            "sinks": [
                {
                    "name": "s",
                    "kind": "iceberg",
                    "topics": [TOPIC],
                    "commit_rows": 50,
                    "catalog": {
                        "type": "rest",
                        "uri": cat.url,
                        "warehouse": cat.warehouse,
                        "properties": {"s3.endpoint": cat.backing.properties["s3.endpoint"]}
                        | {"s3.region": REGION},
                        **given,
                        **catalog,
                    },
                }
            ],
        }
    )


def lane(cfg: ThalwegConfig, end: int = 100, start: int = 0) -> None:
    for p in range(2):
        positions = list(range(start, end))
        payload = {"n": pa.array(positions, pa.int64())}
        write_segment(cfg.gateway.data_dir, TOPIC, p, positions, start, payload=payload)


def sink(cfg: ThalwegConfig) -> IcebergSink:
    found = destination(cfg, cfg.sinks[0])
    assert isinstance(found, IcebergSink)
    return found


def held(cfg: ThalwegConfig) -> list[tuple[int, int]]:
    table = sink(cfg).table(TOPIC)
    if table is None:
        return []
    rows = table.scan().to_arrow()
    return sorted(
        zip(
            rows.column("_twg_source_partition").to_pylist(),
            rows.column("_twg_position").to_pylist(),
            strict=True,
        )
    )


def every(end: int = 100) -> list[tuple[int, int]]:
    return sorted((p, o) for p in range(2) for o in range(end))


def verified(cfg: ThalwegConfig) -> None:
    report = verify(cfg, broker=False, sink="s")
    assert report.ok, report.as_text()
    assert report.sinks["s"]["records_checked"] == 200


# -- vended credentials ---------------------------------------------------------------


def test_the_sink_writes_with_the_keys_the_catalog_vends_and_no_others(
    cloud: Cloud, rest: IcebergRestCatalog, tmp_path: Path
) -> None:
    cfg = configure(tmp_path, rest)
    lane(cfg)
    feeder_pass(cfg, "s")
    assert held(cfg) == every()
    assert rest.vended >= 4  # a load per flush, and the reads above
    assert "vended-credentials" in rest.seen_delegation
    # The bucket refuses what was not issued: the sink had nothing else to write with.
    with pytest.raises(Exception, match="InvalidAccessKeyId"):
        cloud.client("s3", aws_access_key_id="thalweg-test", aws_secret_access_key="x").put_object(
            Bucket=BUCKET, Key="probe", Body=b"1"
        )
    verified(cfg)


def test_keys_of_a_role_without_the_bucket_leave_the_sink_unavailable_named(
    cloud: Cloud, tmp_path: Path
) -> None:
    role = cloud.role("elsewhere")
    cat = _catalog(cloud, tmp_path, vend=cloud.vend(lambda: role), token="t")
    try:
        cfg = configure(tmp_path, cat)
        lane(cfg)
        s = sink(cfg)

        async def go() -> None:
            await s.open()
            rows = pa.table({"_twg_position": pa.array([0], pa.int64())})
            await s.write(rows, Span(TOPIC, 0, 0, 0, 1))
            await s.flush()

        with pytest.raises(SinkUnavailableError, match=r"(?i)access ?denied|forbidden|403"):
            asyncio.run(go())
        assert cat.vended >= 1
        # The catalog made the table (its own keys); no data reached it.
        assert cat.backing.load_table(("thalweg", TOPIC)).current_snapshot() is None
    finally:
        cat.stop()


def test_a_flush_writes_with_keys_vended_since_the_first_ones_stopped_working(
    cloud: Cloud, tmp_path: Path
) -> None:
    roles = [cloud.role(BUCKET)]
    cat = _catalog(cloud, tmp_path, vend=cloud.vend(lambda: roles[-1]), token="t")
    try:
        cfg = configure(tmp_path, cat)
        lane(cfg, 50)
        feeder_pass(cfg, "s")
        # The first role's keys stop working (as expired keys do); keys of a new role
        # are what the catalog vends from now on.
        old = roles[0].rsplit("/", 1)[1]
        cloud.client("iam").delete_role_policy(RoleName=old, PolicyName="lake")
        roles.append(cloud.role(BUCKET))
        before = cat.vended
        lane(cfg, 100, 50)
        feeder_pass(cfg, "s")
        assert cat.vended > before
        assert held(cfg) == every()
        verified(cfg)
    finally:
        cat.stop()


# -- the catalog's auth ---------------------------------------------------------------


def test_a_wrong_bearer_token_leaves_the_sink_unavailable_named(
    rest: IcebergRestCatalog, tmp_path: Path
) -> None:
    cfg = configure(tmp_path, rest, token="not-the-token")
    with pytest.raises(SinkUnavailableError, match=r"(?i)iceberg catalog of sink 's'.*authoriz"):
        asyncio.run(sink(cfg).open())


@pytest.mark.parametrize("right", [True, False])
def test_oauth2_client_credentials_are_exchanged_for_a_token(
    cloud: Cloud, tmp_path: Path, right: bool
) -> None:
    role = cloud.role(BUCKET)
    cat = _catalog(cloud, tmp_path, vend=cloud.vend(lambda: role), client=("twg", "s3cret"))
    try:
        cfg = configure(tmp_path, cat, credential="twg:" + ("s3cret" if right else "wrong"))
        if not right:
            with pytest.raises(SinkUnavailableError, match="iceberg catalog of sink 's'"):
                asyncio.run(sink(cfg).open())
            return
        lane(cfg)
        feeder_pass(cfg, "s")
        assert held(cfg) == every()
        verified(cfg)
    finally:
        cat.stop()


@pytest.mark.parametrize("right", [True, False])
def test_sigv4_signed_requests_are_checked_by_the_catalog(
    cloud: Cloud, tmp_path: Path, right: bool
) -> None:
    role = cloud.role(BUCKET)
    key = SigV4("AKIDTWGSIGNER", "signing-secret", REGION)
    cat = _catalog(cloud, tmp_path, vend=cloud.vend(lambda: role), sigv4=key)
    try:
        signing = {
            "rest.sigv4-enabled": "true",
            "rest.signing-region": REGION,
            "rest.signing-name": key.service,
        }
        cfg = configure(
            tmp_path,
            cat,
            properties={"s3.endpoint": cloud.moto.endpoint, "s3.region": REGION, **signing},
            secret_properties={
                "client.access-key-id": key.access_key_id,
                "client.secret-access-key": key.secret_access_key if right else "wrong",
            },
        )
        if not right:
            with pytest.raises(SinkUnavailableError, match="iceberg catalog of sink 's'"):
                asyncio.run(sink(cfg).open())
            return
        lane(cfg)
        feeder_pass(cfg, "s")
        assert held(cfg) == every()
        verified(cfg)
    finally:
        cat.stop()


# -- commits under faults -------------------------------------------------------------


def test_a_conflict_with_another_writer_is_retried_from_a_fresh_load(
    rest: IcebergRestCatalog, tmp_path: Path
) -> None:
    cfg = configure(tmp_path, rest)
    lane(cfg, 10)
    feeder_pass(cfg, "s")  # the table exists

    def another_writer() -> None:
        # Another engine's append between the sink's load and its commit (a row with
        # no lane position: not one of the sink's).
        table = rest.backing.load_table(("thalweg", TOPIC))
        schema = table.schema().as_arrow()
        row = {f.name: pa.nulls(1, f.type) for f in schema}
        row["n"] = pa.array([-1], pa.int64())
        table.append(pa.table(row, schema))

    rest.before_commit.append(another_writer)
    lane(cfg, 100, 10)
    feeder_pass(cfg, "s")
    assert rest.conflicts >= 1 and not rest.before_commit
    rows = rest.backing.load_table(("thalweg", TOPIC)).scan().to_arrow()
    assert rows.column("n").to_pylist().count(-1) == 1  # the other writer's row is kept
    assert sorted(rows.filter(pc.field("n") >= 0).column("n").to_pylist()) == sorted(
        [o for _, o in every()]
    )


def test_a_flush_another_writer_of_the_sink_landed_in_part_lands_once(
    rest: IcebergRestCatalog, tmp_path: Path
) -> None:
    cfg = configure(tmp_path, rest)
    lane(cfg)
    # Just before the sink's first commit, a twin of it (another gateway with the same
    # lane that had not heard it lost the partitions) lands positions [0, 25) of each
    # partition: the table appears under the sink, and its flush holds rows the twin
    # has landed.
    (tmp_path / "twin").mkdir()
    twin = configure(tmp_path / "twin", rest)
    lane(twin)
    rest.before_commit.append(lambda: feeder_pass(twin, "s", topic=TOPIC, start=0, end=25))
    feeder_pass(cfg, "s")
    assert not rest.before_commit
    assert held(cfg) == every()
    verified(cfg)


def test_a_commit_whose_answer_is_lost_leads_to_no_duplicate(
    rest: IcebergRestCatalog, tmp_path: Path
) -> None:
    cfg = configure(tmp_path, rest)
    lane(cfg)
    rest.lose_answers = 1
    with pytest.raises(SinkUnavailableError):
        feeder_pass(cfg, "s")
    assert rest.commits >= 1 and rest.lose_answers == 0
    again = feeder_pass(cfg, "s")  # opens: the table's record says what landed
    assert again.rows <= 200
    assert held(cfg) == every()
    verified(cfg)


# -- Glue, read by a second implementation ----------------------------------------------


def test_a_table_in_glue_is_read_back_by_duckdbs_iceberg_reader(
    moto: MotoServer, tmp_path: Path
) -> None:
    """The sink on Glue (moto's Glue API, its warehouse on moto's S3), read back by
    DuckDB's iceberg extension (iceberg-cpp's reader, not pyiceberg) from the metadata
    file Glue names."""
    from tests.helpers import duckdb_with
    from tests.moto_server import ACCESS_KEY, SECRET_KEY

    bucket = moto.bucket_url("glue").removeprefix("s3://").split("/")[0]
    namespace = f"g_{uuid.uuid4().hex[:8]}"
    keys = {"access-key-id": ACCESS_KEY, "secret-access-key": SECRET_KEY}
    cfg = parse_config(
        {
            "gateway": {"data_dir": str(tmp_path / "data")},
            "sources": [
                {
                    "name": "k",
                    "kind": "kafka",
                    "bootstrap_servers": "127.0.0.1:9",
                    "topics": [TOPIC],
                }
            ],
            "sinks": [
                {
                    "name": "s",
                    "kind": "iceberg",
                    "topics": [TOPIC],
                    "namespace": namespace,
                    "catalog": {
                        "type": "glue",
                        "warehouse": f"s3://{bucket}/warehouse",
                        "properties": {
                            "glue.endpoint": moto.endpoint,
                            "glue.region": REGION,
                            "s3.endpoint": moto.endpoint,
                            "s3.region": REGION,
                        },
                        "secret_properties": {
                            **{f"glue.{k}": v for k, v in keys.items()},
                            **{f"s3.{k}": v for k, v in keys.items()},
                        },
                    },
                }
            ],
        }
    )
    lane(cfg)
    feeder_pass(cfg, "s")
    glue = boto3.client(
        "glue",
        endpoint_url=moto.endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    entry = glue.get_table(DatabaseName=namespace, Name=TOPIC)["Table"]
    assert entry["Parameters"]["table_type"].upper() == "ICEBERG"
    metadata = entry["Parameters"]["metadata_location"]
    con = duckdb_with("httpfs", "avro", "iceberg")
    host = moto.endpoint.removeprefix("http://")
    con.execute(
        f"CREATE SECRET moto (TYPE S3, KEY_ID '{ACCESS_KEY}', SECRET '{SECRET_KEY}', "
        f"REGION '{REGION}', ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)"
    )
    got = con.execute(
        f"SELECT _twg_source_partition, _twg_position, n FROM iceberg_scan('{metadata}')"
    ).fetchall()
    assert sorted((p, o) for p, o, _ in got) == every()
    assert all(n == o for _, o, n in got)
    verified(cfg)
