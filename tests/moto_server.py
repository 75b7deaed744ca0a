"""An S3-compatible server for the tests: ``moto`` in server mode on a free loopback port,
in its own process group, stopped by pid. Credentials are dummies moto accepts."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.services import start_service, stop_group
from thalweg.embedded.tansu import free_port

ACCESS_KEY = "thalweg-test"
SECRET_KEY = "thalweg-test-secret"
REGION = "us-east-1"


class MotoServer:
    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.log = log
        self.proc = start_service(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            log,
            self.port,
        )

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> object:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def stop(self) -> None:
        stop_group(self.proc)

    def bucket_url(self, prefix: str = "lanes") -> str:
        """A new bucket's ``s3://<bucket>/lane`` URL."""
        import uuid

        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.client().create_bucket(Bucket=name)  # type: ignore[attr-defined]
        return f"s3://{name}/lane"

    def store(self, url: str) -> object:
        """An ``ObjectStore`` on ``url`` of this server (the tests' reading side)."""
        from thalweg.config.models import ObjectStoreConfig
        from thalweg.lane.remote.objectstore import ObjectStore

        cfg = ObjectStoreConfig(
            url=url,
            endpoint_url=self.endpoint,
            region=REGION,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,  # type: ignore[arg-type]
            cache_dir=Path("unused"),
        )
        return ObjectStore(cfg)
