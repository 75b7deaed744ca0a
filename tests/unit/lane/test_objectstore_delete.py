"""A ``DeleteObjects`` answer is 200 even when the store refused keys (a deny policy, an
object lock): the refusal is in its ``Errors``, and the lane's upkeep must see it.

moto refuses no plain delete, so the store's answer is given by botocore's ``Stubber``,
which checks each request against the S3 model; nothing leaves the process.
"""

from __future__ import annotations

import pytest
from botocore.stub import Stubber

from thalweg.config.models import ObjectStoreConfig
from thalweg.errors import LaneError
from thalweg.lane.remote.objectstore import ObjectStore


def store() -> ObjectStore:
    return ObjectStore(
        ObjectStoreConfig(
            url="s3://lake/lane",
            endpoint_url="http://127.0.0.1:9",
            region="us-east-1",
            access_key_id="k",
            secret_access_key="s",
        )
    )


def test_a_refused_key_is_an_error_naming_it_and_later_chunks_are_not_asked_for() -> None:
    s = store()
    rels = [f"raw/p/{i:04d}.parquet" for i in range(1500)]  # two requests of ≤ 1,000
    first = [{"Key": s.key(r)} for r in rels[:1000]]
    with Stubber(s._s3) as stub:
        stub.add_response(
            "delete_objects",
            {
                "Deleted": [{"Key": k["Key"]} for k in first[1:]],
                "Errors": [{"Key": first[0]["Key"], "Code": "AccessDenied", "Message": "no"}],
            },
            {"Bucket": "lake", "Delete": {"Objects": first}},
        )
        with pytest.raises(
            LaneError, match=r"refused for 1 of 1000 objects, first lane/raw/p/0000"
        ):
            s.delete(rels)
        stub.assert_no_pending_responses()  # a second request would find none queued


def test_keys_all_deleted_or_already_absent_are_no_error() -> None:
    s = store()
    rels = ["decoded/p/a.parquet", "raw/p/a.parquet"]
    with Stubber(s._s3) as stub:
        objects = [{"Key": s.key(r)} for r in rels]
        stub.add_response(
            "delete_objects",
            {"Deleted": objects},
            {"Bucket": "lake", "Delete": {"Objects": objects}},
        )
        s.delete(rels)
        stub.assert_no_pending_responses()
