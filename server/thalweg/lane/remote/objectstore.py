"""An S3-compatible bucket as the lanes' durable tier: create-only PUTs, listings, gets.

A segment object is written once under its final name and never replaced: every PUT
sends ``If-None-Match: *``, so the store refuses a second object under a name that
exists (``412 Precondition Failed``) — there is no rename to make atomic, and two
writers cannot both create one name. A PUT that is retried after it had in fact landed
finds its own bytes there (same ETag, the MD5 of a single-part upload) and succeeds.

boto3 is imported here only, when an object store is configured (``thalweg[s3]``).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from thalweg.config.models import ObjectStoreConfig
from thalweg.errors import ConfigError, LaneError, SegmentConflictError
from thalweg.lane.durable import write_file_durably

log = logging.getLogger(__name__)

T = TypeVar("T")


POOL = 32  # connections: the partitions of a sync fetch side by side (lane/remote/mirror.py)
_CHUNK = 1 << 20


class ObjectStore:
    """One bucket and key prefix, through boto3 (thread-safe client)."""

    def __init__(self, cfg: ObjectStoreConfig) -> None:
        if cfg.url is None:
            raise ConfigError("gateway.object_store.url is not set")
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise ConfigError(
                "lanes in an object store need boto3: pip install 'thalweg[s3]'"
            ) from exc
        bucket, _, prefix = cfg.url.removeprefix("s3://").partition("/")
        self.url = cfg.url
        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        secret = cfg.secret_access_key.get_secret_value() if cfg.secret_access_key else None
        self._s3: Any = boto3.client(
            "s3",
            endpoint_url=cfg.endpoint_url,
            region_name=cfg.region,
            aws_access_key_id=cfg.access_key_id,
            aws_secret_access_key=secret,
            config=Config(
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
                max_pool_connections=POOL,
            ),
        )

    def key(self, rel: str) -> str:
        return self.prefix + rel

    def put_new(self, rel: str, path: Path) -> None:
        """Create ``rel`` from ``path``'s bytes; durable when this returns.

        Raises:
            SegmentConflictError: another object with other bytes has that name.
            LaneError: the store did not take it (retriable).
        """
        from botocore.exceptions import BotoCoreError, ClientError

        body = path.read_bytes()
        try:
            self._s3.put_object(Bucket=self.bucket, Key=self.key(rel), Body=body, IfNoneMatch="*")
        except ClientError as exc:
            if _status(exc) != 412:
                raise LaneError(f"{self.url}/{rel}: PUT refused: {exc}", retriable=True) from exc
            if self._etag(rel) == hashlib.md5(body, usedforsecurity=False).hexdigest():
                return  # a retried PUT that had landed: the same bytes are there
            raise SegmentConflictError(
                f"{self.url}/{rel} exists with other bytes: another writer of this lane"
            ) from exc
        except BotoCoreError as exc:
            raise LaneError(f"{self.url}/{rel}: PUT failed: {exc}", retriable=True) from exc

    def put(self, rel: str, body: bytes) -> None:
        """Create or replace ``rel`` (small records that change: a retention floor).

        Raises:
            LaneError: the store did not take it (retriable).
        """
        with self._asking(f"{rel}: PUT"):
            self._s3.put_object(Bucket=self.bucket, Key=self.key(rel), Body=body)

    def read(self, rel: str) -> bytes | None:
        """``rel``'s bytes; None when it does not exist.

        Raises:
            LaneError: the store did not answer (retriable).
        """

        def get() -> bytes:
            body: bytes = self._s3.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"].read()
            return body

        return self._found(f"{rel}: GET", get)

    def listing(self, rel_prefix: str) -> dict[str, int]:
        """Relative keys under ``rel_prefix`` and their sizes.

        Raises:
            LaneError: the store did not answer (retriable).
        """
        out: dict[str, int] = {}
        with self._asking(f"{rel_prefix}: LIST"):
            pages = self._s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.key(rel_prefix)
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    out[obj["Key"][len(self.prefix) :]] = int(obj["Size"])
        return out

    def get(self, rel: str, dest: Path) -> bool:
        """Fetch ``rel`` into ``dest`` (whole or not at all; never over an existing file).
        False when ``dest`` already existed.

        Raises:
            LaneError: the store did not answer, or the object is gone (retriable).
        """

        def write(tmp: Path) -> None:
            # One GET streamed to the file: boto3's download_file adds a HEAD and a
            # transfer manager with threads of its own to every object (a replica's cold
            # sync of small segments spent most of its time there).
            body = self._s3.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"]
            with open(tmp, "wb") as f:
                shutil.copyfileobj(body, f, _CHUNK)

        try:
            with self._asking(f"{rel}: GET"):
                write_file_durably(dest, write, exclusive=True)
        except FileExistsError:
            return False
        return True

    def delete(self, rels: list[str]) -> None:
        """Remove objects (absent ones are no error), in order, a request per 1,000.

        Raises:
            LaneError: the store refused a key (``DeleteObjects`` answers 200 and names
                the keys it did not delete); the keys after it are not asked for.
        """
        for i in range(0, len(rels), 1000):
            chunk = [{"Key": self.key(r)} for r in rels[i : i + 1000]]
            with self._asking("DELETE"):
                answer = self._s3.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk})
            refused = answer.get("Errors") or []
            if refused:
                first = refused[0]
                raise LaneError(
                    f"{self.url}: DELETE refused for {len(refused)} of {len(chunk)} objects, "
                    f"first {first.get('Key')}: {first.get('Code')} {first.get('Message')}",
                    retriable=True,
                )

    def _found(self, what: str, call: Callable[[], T]) -> T | None:
        """``call()``; None when the object does not exist (404)."""
        from botocore.exceptions import ClientError

        with self._asking(what):
            try:
                return call()
            except ClientError as exc:
                if _status(exc) == 404:
                    return None
                raise

    @contextmanager
    def _asking(self, what: str) -> Iterator[None]:
        """The store's errors as a retriable :class:`LaneError` naming ``what``."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (ClientError, BotoCoreError) as exc:
            raise LaneError(f"{self.url}/{what} failed: {exc}", retriable=True) from exc

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` is in the store.

        Raises:
            LaneError: the store did not answer (retriable).
        """
        head = self._found(
            f"{rel}: HEAD", lambda: self._s3.head_object(Bucket=self.bucket, Key=self.key(rel))
        )
        return head is not None

    def _etag(self, rel: str) -> str | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            head = self._s3.head_object(Bucket=self.bucket, Key=self.key(rel))
        except (ClientError, BotoCoreError):
            return None
        return str(head.get("ETag", "")).strip('"')


def _status(exc: Any) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
