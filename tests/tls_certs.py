"""Throwaway certificate authorities and certificates for TLS tests (openssl CLI)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class Pki:
    """A CA with a server certificate for 127.0.0.1 and a client certificate, plus a
    second, unrelated CA (for "untrusted" cases). Paths to PEM files."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path

    def pem(self, name: str) -> bytes:
        return Path(getattr(self, name)).read_bytes()


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
        str(cert), "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def _leaf(d: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    cert, key, csr, extfile = (d / f"{name}{s}" for s in (".pem", ".key", ".csr", ".ext"))
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", f"/CN={name}",
    )  # fmt: skip
    extfile.write_text(ext)
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extfile),
    )  # fmt: skip
    return cert, key


def make_pki(d: Path) -> Pki:
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "test-ca")
    server = _leaf(
        d, "server", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    )
    client = _leaf(d, "client", ca, "extendedKeyUsage=clientAuth\n")
    other = _ca(d, "other-ca")
    return Pki(ca[0], server[0], server[1], client[0], client[1], other[0])
