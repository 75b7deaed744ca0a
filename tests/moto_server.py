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
