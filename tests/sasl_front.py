"""A TLS + SASL terminating front for tansu: the secured Kafka cluster of the tests.

tansu 0.6 cannot be that cluster itself: its ``--cert`` and ``--key`` are mutually
exclusive (it never serves TLS), and with its memory engine ``tansu user create`` keeps no
SCRAM credentials. noida-db (the other Kafka-speaking broker here) has no TLS or SASL
options for Kafka. So this front does what a secured broker's listener does and nothing
more: it terminates TLS (optionally requiring a client certificate from the test CA),
answers ``SaslHandshake`` and ``SaslAuthenticate`` itself — PLAIN, SCRAM-SHA-256/512 as a
strict RFC 5802 server, OAUTHBEARER (RFC 7628) with a token check the test supplies — and,
once a connection has logged in, pipes its bytes to a plain tansu, which advertises the
front's port so every connection a client opens comes back through here.

A refused login is answered the way a broker may answer it (``refuse``): ``"kafka"`` is
Apache Kafka's (``SaslAuthenticate`` error 58, ``SASL_AUTHENTICATION_FAILED``, with a
message); ``"scram-e"`` is tansu's own and RFC 5802's (a server-final message ``e=…`` with
no error code), the form that crashed aiokafka's SCRAM client (``KeyError: 'v'``).

Every login attempt is counted (``attempts``, ``accepted``, ``refused``): the tests assert
that a gateway with a wrong credential backs off instead of storming the broker.

Only the request versions aiokafka sends are understood (``SaslHandshake`` v0/v1,
``SaslAuthenticate`` v0/v1, non-flexible headers); anything else before a login closes
the connection, as a broker does.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import ssl
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from thalweg.embedded import free_port

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, SASL_AUTHENTICATION_FAILED = 33, 58
ITERATIONS = 4096  # Kafka's minimum for SCRAM credentials
HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


@dataclass
class Counts:
    attempts: int = 0
    accepted: int = 0
    refused: int = 0
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Tls:
    """The front's certificate, and the CA whose client certificates it requires (if
    ``client_ca`` is set; none asked for otherwise)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.cert), str(self.key))
        if self.client_ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cafile=str(self.client_ca))
        return ctx


class _RefusedError(Exception):
    """A login refused, with the reason the broker gives."""


class _Scram:
    """One RFC 5802 server conversation (two client messages)."""

    def __init__(self, mechanism: str, users: dict[str, str]) -> None:
        self.hash = HASHES[mechanism]
        self.users = users
        self.step = 0
        self.unknown = False

    def _h(self, data: bytes) -> bytes:
        return hashlib.new(self.hash, data).digest()

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self.hash).digest()

    def first(self, msg: str) -> bytes:
        if not msg.startswith("n,,"):
            raise _RefusedError("malformed SCRAM client-first message")
        self.client_first_bare = msg[3:]
        attrs = dict(p.split("=", 1) for p in self.client_first_bare.split(","))
        self.user = attrs["n"].replace("=2C", ",").replace("=3D", "=")
        # An unknown user gets a made-up salt (RFC 5802 5.1: do not reveal who exists).
        self.unknown = self.user not in self.users
        self.salt = hashlib.sha256(self.user.encode()).digest()[:16]
        self.nonce = attrs["r"] + base64.b64encode(os.urandom(18)).decode()
        salt = base64.b64encode(self.salt).decode()
        self.server_first = f"r={self.nonce},s={salt},i={ITERATIONS}"
        return self.server_first.encode()

    def final(self, msg: str) -> bytes:
        without_proof, _, proof = msg.rpartition(",p=")
        attrs = dict(p.split("=", 1) for p in without_proof.split(","))
        if attrs.get("r") != self.nonce or attrs.get("c") != "biws":
            raise _RefusedError("SCRAM nonce or channel binding mismatch")
        if self.unknown:
            raise _RefusedError("unknown-user")
        salted = hashlib.pbkdf2_hmac(
            self.hash, self.users[self.user].encode(), self.salt, ITERATIONS
        )
        client_key = self._hmac(salted, b"Client Key")
        stored_key = self._h(client_key)
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        signature = self._hmac(stored_key, auth_message)
        sent = base64.b64decode(proof)
        if self._h(bytes(a ^ b for a, b in zip(sent, signature, strict=True))) != stored_key:
            raise _RefusedError("invalid-proof")
        server_key = self._hmac(salted, b"Server Key")
        return b"v=" + base64.b64encode(self._hmac(server_key, auth_message))


class SaslFront:
    """``127.0.0.1:port`` (TLS if ``tls``) in front of tansu at ``127.0.0.1:target``.

    Args:
        mechanisms: the SASL mechanisms enabled (a handshake naming another is refused);
            none: a TLS-only listener, no login.
        users: username → password, for PLAIN and SCRAM.
        token_ok: the OAUTHBEARER check: is this bearer token acceptable?
        refuse: how a refused login is answered (``"kafka"`` or ``"scram-e"``).
    """

    def __init__(
        self,
        target: int,
        *,
        port: int | None = None,
        tls: Tls | None = None,
        mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
        users: dict[str, str] | None = None,
        token_ok: Callable[[str], bool] | None = None,
        refuse: str = "kafka",
    ) -> None:
        self.port = port or free_port()
        self.target = target
        self.tls = tls
        self.mechanisms = mechanisms
        self.users = users or {}
        self.token_ok = token_ok or (lambda _t: False)
        self.refuse = refuse
        self.counts = Counts()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, name="sasl-front", daemon=True)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> SaslFront:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the SASL front did not start")
        return self

    def stop(self) -> None:
        """Close the listener and every connection, then end the front's thread."""
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)

    def __enter__(self) -> SaslFront:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        ctx = self.tls.context() if self.tls else None
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=ctx)
        )
        self._ready.set()
        self._loop.run_forever()

    def _count(self, outcome: str, reason: str = "") -> None:
        with self._lock:
            if outcome == "attempt":
                self.counts.attempts += 1
            elif outcome == "accepted":
                self.counts.accepted += 1
            else:
                self.counts.refused += 1
                self.counts.reasons.append(reason)

    # -- one connection ------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            self._conns.discard(task)
            return
        try:
            # No mechanisms: a TLS-only listener (security_protocol SSL), no login.
            if not self.mechanisms or await self._login(reader, writer, up_reader, up_writer):
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the peer went away
        finally:
            self._conns.discard(task)
            for w in (writer, up_writer):
                w.close()

    async def _login(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> bool:
        """Serve requests until a login succeeds (True) or is refused (False)."""
        mechanism: str | None = None
        scram: _Scram | None = None
        while True:
            frame = await _read_frame(reader)
            api_key, version, corr = struct.unpack(">hhi", frame[:8])
            if api_key == API_VERSIONS:  # the broker's own answer
                up_writer.write(struct.pack(">i", len(frame)) + frame)
                await up_writer.drain()
                writer.write(_framed(await _read_frame(up_reader)))
                await writer.drain()
                continue
            body = _skip_client_id(frame)
            if api_key == SASL_HANDSHAKE and version <= 1:
                mechanism = _string(body)
                ok = mechanism in self.mechanisms
                answer = struct.pack(">ih", corr, 0 if ok else UNSUPPORTED_SASL_MECHANISM)
                answer += _strings(list(self.mechanisms))
                writer.write(_framed(answer))
                await writer.drain()
                if not ok:
                    self._count("attempt")
                    self._count("refused", f"mechanism {mechanism}")
                    return False
                scram = _Scram(mechanism, self.users) if mechanism in HASHES else None
                continue
            if api_key != SASL_AUTHENTICATE or version > 1 or mechanism is None:
                return False  # not a login: a broker closes the connection
            (n,) = struct.unpack(">i", body[:4])
            token = body[4 : 4 + n]
            try:
                reply, done = self._step(mechanism, scram, token)
            except _RefusedError as exc:
                self._count("refused", str(exc))
                await self._refused(writer, corr, version, mechanism, str(exc))
                return False
            writer.write(_framed(_auth_answer(corr, version, 0, None, reply)))
            await writer.drain()
            if done:
                self._count("accepted")
                return True

    def _step(self, mechanism: str, scram: _Scram | None, token: bytes) -> tuple[bytes, bool]:
        """One SASL step: (the answer, whether the login is complete)."""
        if scram is not None:
            scram.step += 1
            if scram.step == 1:
                self._count("attempt")
                return scram.first(token.decode()), False
            return scram.final(token.decode()), True
        self._count("attempt")
        if mechanism == "PLAIN":
            _authzid, user, password = token.decode().split("\0")
            if self.users.get(user) != password:
                raise _RefusedError("invalid-proof")
            return b"", True
        # OAUTHBEARER (RFC 7628): "n,,\x01auth=Bearer <token>\x01...\x01\x01"
        fields = dict(kv.split("=", 1) for kv in token.decode().split("\x01")[1:] if "=" in kv)
        scheme, _, bearer = fields.get("auth", "").partition(" ")
        if scheme != "Bearer" or not self.token_ok(bearer):
            raise _RefusedError("invalid_token")
        return b"", True

    async def _refused(
        self, writer: asyncio.StreamWriter, corr: int, version: int, mechanism: str, why: str
    ) -> None:
        if self.refuse == "scram-e" and mechanism in HASHES:
            answer = _auth_answer(corr, version, 0, None, f"e={why}".encode())
        else:
            message = (
                "Authentication failed during authentication due to invalid credentials "
                f"with SASL mechanism {mechanism}"
            )
            answer = _auth_answer(corr, version, SASL_AUTHENTICATION_FAILED, message, b"")
        writer.write(_framed(answer))
        await writer.drain()


def _auth_answer(corr: int, version: int, error: int, message: str | None, auth: bytes) -> bytes:
    out = struct.pack(">ih", corr, error) + _nullable(message)
    out += struct.pack(">i", len(auth)) + auth
    if version >= 1:
        out += struct.pack(">q", 0)  # session_lifetime_ms: no re-authentication
    return out


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (n,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(n)


def _framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _skip_client_id(frame: bytes) -> bytes:
    (n,) = struct.unpack(">h", frame[8:10])
    return frame[10 + max(n, 0) :]


def _string(body: bytes) -> str:
    (n,) = struct.unpack(">h", body[:2])
    return body[2 : 2 + n].decode()


def _nullable(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    data = s.encode()
    return struct.pack(">h", len(data)) + data


def _strings(items: list[str]) -> bytes:
    return struct.pack(">i", len(items)) + b"".join(_nullable(s) for s in items)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    while data := await src.read(65536):
        dst.write(data)
        await dst.drain()
    dst.close()
