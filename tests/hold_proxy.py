"""A TCP proxy on loopback that can hold what its clients send.

Put before an S3 server, it freezes a gateway's request mid-flight: ``hold()`` keeps
every byte clients send from the server — buffered, in order, per connection — so a
PUT the gateway has sent (its fence already asked) has not reached the store; the test
can then SIGSTOP the gateway, let another member take over, and ``release()`` the PUT
to land late, as a zombie's does. ``held_requests`` lists the request lines held.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Callable

from thalweg.embedded import free_port

_REQUEST_LINE = re.compile(rb"(?:^|\r\n)((?:GET|PUT|POST|HEAD|DELETE) [^ ]+) HTTP/1\.1")


class HoldingProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.held_requests: list[str] = []
        self._held = False
        self._armed: Callable[[str], bool] | None = None
        self._lock = threading.Lock()
        self._pending: list[tuple[socket.socket, list[bytes]]] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="hold-proxy").start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hold(self, when: Callable[[str], bool] | None = None) -> None:
        """Hold from now on — or, with ``when``, from the first request whose request
        line (``"PUT /bucket/key"``) it accepts: that request and everything after it."""
        with self._lock:
            if when is None:
                self._held = True
            else:
                self._armed = when

    def release(self) -> None:
        """Send everything held, in order, then pass bytes through again."""
        with self._lock:
            for upstream, chunks in self._pending:
                # A connection that ended meanwhile took its requests with it.
                with contextlib.suppress(OSError):
                    for chunk in chunks:
                        upstream.sendall(chunk)
                chunks.clear()
            self._held, self._armed = False, None

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            chunks: list[bytes] = []
            with self._lock:
                self._pending.append((upstream, chunks))
            threading.Thread(
                target=self._forward, args=(client, upstream, chunks), daemon=True
            ).start()
            threading.Thread(target=self._back, args=(upstream, client), daemon=True).start()

    def _forward(self, client: socket.socket, upstream: socket.socket, chunks: list[bytes]) -> None:
        """Client to server, or into ``chunks`` while held, until either side closes."""
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    lines = [m.decode() for m in _REQUEST_LINE.findall(data)]
                    if self._armed is not None and any(map(self._armed, lines)):
                        self._held, self._armed = True, None
                    if self._held:
                        chunks.append(data)
                        self.held_requests += lines
                        continue
                upstream.sendall(data)
        _shut(upstream)

    @staticmethod
    def _back(upstream: socket.socket, client: socket.socket) -> None:
        """Server to client, until either side closes."""
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                client.sendall(data)
        _shut(client)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)
