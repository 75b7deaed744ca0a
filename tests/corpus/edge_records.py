"""Edge-value records that abstractions usually swallow. Each entry is produced, then must
come back identical through the raw lane (Parquet) and Flight ``do_get``."""

from __future__ import annotations

from dataclasses import dataclass, field

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Edge:
    name: str
    key: bytes | None
    value: bytes | None
    headers: Headers = field(default_factory=list)
    timestamp_ms: int | None = None  # None: let the producer stamp it


EDGES: tuple[Edge, ...] = (
    Edge("null key, empty value", None, b""),
    Edge("empty key, null value (tombstone)", b"", None),
    Edge("null key, null value", None, None),
    Edge("empty key, empty value", b"", b""),
    Edge("binary key and value", b"\x00\xff\x10", b"\xff\xfe\x00not utf8"),
    Edge("one header", b"k", b"{}", [("h", b"v")]),
    Edge("duplicate header keys in order", b"k", b"{}", [("a", b"1"), ("b", b"2"), ("a", b"3")]),
    Edge("null and empty header values", b"k", b"{}", [("n", None), ("e", b""), ("n", None)]),
    Edge("200 headers", b"k", b"{}", [(f"h{i % 7}", str(i).encode()) for i in range(200)]),
    Edge("zero timestamp", b"k", b"{}", timestamp_ms=0),
    Edge("unicode header key", b"k", b"{}", [("ключ-鍵", "värde".encode())]),
    Edge("large value", b"k", b"x" * 300_000),
)
