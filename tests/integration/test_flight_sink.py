"""The Flight sink against a real (in-process) Flight server: one ``do_put`` per topic to
the templated path; a failed put lands nothing and the rows sent again land (at least
once: the receiver deduplicates by ``_twg_record_id``); a refused token is named."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyarrow import flight

from thalweg.config.sinks import FlightSinkConfig
from thalweg.sinks.base import Landed, SinkRefusedError, SinkState, SinkUnavailableError, Span
from thalweg.sinks.flight import FlightSink

pytestmark = pytest.mark.integration

RID = "_twg_record_id"
TOKEN = "s3cret"


class _BearerFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Refuses every call whose ``authorization`` header is not ``Bearer <TOKEN>``."""

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> None:
        if headers.get("authorization") != [f"Bearer {TOKEN}"]:
            raise flight.FlightUnauthenticatedError("bad or missing bearer token")


class _Receiver(flight.FlightServerBase):  # type: ignore[misc]
    """Collects do_put tables per descriptor path. ``fail`` makes the next puts fail
    with UNAVAILABLE; ``store_then_fail`` keeps a failing put's rows first (the server
    took them, the client never heard so)."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0", middleware={"auth": _BearerFactory()})
        self.tables: dict[str, list[pa.Table]] = {}
        self.fail = 0
        self.store_then_fail = False
        self._lock = threading.Lock()

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        path = "/".join(p.decode() for p in descriptor.path)
        with self._lock:
            failing = self.fail > 0
            self.fail -= failing
        if failing and not self.store_then_fail:
            raise flight.FlightUnavailableError("receiver is down")
        table = reader.read_all()
        with self._lock:
            self.tables.setdefault(path, []).append(table)
        if failing:
            raise flight.FlightUnavailableError("receiver lost the ack")
        writer.write(pa.py_buffer(b"ok"))

    def rows(self, path: str) -> pa.Table:
        return pa.concat_tables(self.tables[path])


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    server = _Receiver()
    try:
        yield server
    finally:
        server.shutdown()


def _sink(tmp_path: Path, server: _Receiver, token: str | None = TOKEN) -> FlightSink:
    cfg = FlightSinkConfig(
        name="out",
        kind="flight",
        topics=["orders", "users"],
        location=f"grpc://127.0.0.1:{server.port}",
        path="lake/{topic}",
        token=token,  # type: ignore[arg-type]  # pydantic makes the SecretStr
        timeout_s=10,
    )
    return FlightSink(cfg, tmp_path)


def _rows(tag: int, *positions: int) -> pa.Table:
    return pa.table(
        {
            RID: pa.array([bytes([tag, p]) * 8 for p in positions], pa.binary(16)),
            "_twg_position": pa.array(positions, pa.int64()),
            "n": pa.array([p * 10 for p in positions], pa.int64()),
        }
    )


SPANS = [
    (_rows(1, 0, 1, 2), Span("orders", 0, 0, 0, 3)),
    (_rows(1, 3, 4), Span("orders", 0, 0, 3, 5)),
    (_rows(2, 7), Span("users", 1, 0, 7, 8)),
    (_rows(2, 8, 9), Span("users", 1, 0, 8, 10)),
]


async def _write_all(sink: FlightSink) -> None:
    for rows, span in SPANS:
        await sink.write(rows, span)


def test_a_flush_puts_each_topic_to_its_path(tmp_path: Path, receiver: _Receiver) -> None:
    sink = _sink(tmp_path, receiver)

    async def go() -> tuple[Landed | None, Landed]:
        opened = await sink.open()
        await _write_all(sink)
        landed = await sink.flush()
        await sink.close()
        return opened, landed

    opened, landed = asyncio.run(go())
    assert opened is None  # the receiver keeps no coverage: the store is the only record
    assert landed == Landed.of([s for _, s in SPANS])
    assert sorted(receiver.tables) == ["lake/orders", "lake/users"]
    assert len(receiver.tables["lake/orders"]) == 1  # one put per topic and flush
    assert receiver.rows("lake/orders").equals(pa.concat_tables([SPANS[0][0], SPANS[1][0]]))
    assert receiver.rows("lake/users").equals(pa.concat_tables([SPANS[2][0], SPANS[3][0]]))
    assert sink.health().state is SinkState.UP


@pytest.mark.parametrize("store_then_fail", [False, True], ids=["refused", "ack-lost"])
def test_a_failed_put_lands_nothing_and_the_rewrite_lands(
    tmp_path: Path, receiver: _Receiver, store_then_fail: bool
) -> None:
    sink = _sink(tmp_path, receiver)
    receiver.fail, receiver.store_then_fail = 1, store_then_fail

    async def failing() -> None:
        await sink.open()
        await _write_all(sink)
        await sink.flush()

    with pytest.raises(SinkUnavailableError, match=r"flight sink 'out' at grpc://127\.0\.0\.1"):
        asyncio.run(failing())
    health = sink.health()
    assert health.state is SinkState.DOWN and "receiver" in health.detail
    assert "\n" not in health.detail

    async def again() -> Landed:
        assert (await sink.flush()).empty  # the failed flush's rows were dropped
        await sink.open()  # the feeder re-opens and writes the same spans again
        await _write_all(sink)
        landed = await sink.flush()
        await sink.close()
        return landed

    assert asyncio.run(again()) == Landed.of([s for _, s in SPANS])
    assert sink.health().state is SinkState.UP
    # At least once: the put whose ack was lost ("orders", the first) is stored twice;
    # the record ids deduplicate it to exactly the rows written.
    stored = {"lake/orders": 10 if store_then_fail else 5, "lake/users": 3}
    for path, want in {"lake/orders": 5, "lake/users": 3}.items():
        got = receiver.rows(path)
        assert got.num_rows == stored[path] and len(set(got[RID].to_pylist())) == want


def test_a_wrong_token_is_named_unauthenticated(tmp_path: Path, receiver: _Receiver) -> None:
    sink = _sink(tmp_path, receiver, token="wrong")

    async def go() -> None:
        await sink.open()
        await _write_all(sink)
        await sink.flush()

    with pytest.raises(SinkUnavailableError, match="unauthenticated") as info:
        asyncio.run(go())
    assert "s3cret" not in str(info.value) and "wrong" not in str(info.value)
    assert sink.health().state is SinkState.DOWN
    assert receiver.tables == {}
    asyncio.run(sink.close())


def test_an_unreachable_receiver_is_unavailable(tmp_path: Path, receiver: _Receiver) -> None:
    sink = _sink(tmp_path, receiver)
    receiver.shutdown()

    async def go() -> None:
        await sink.open()
        await _write_all(sink)
        await sink.flush()

    with pytest.raises(SinkUnavailableError, match=r"do_put 'lake/orders' failed: .*unavailable"):
        asyncio.run(go())
    assert sink.health().state is SinkState.DOWN
    asyncio.run(sink.close())


def test_a_routed_path_puts_each_value_apart_and_refuses_past_max_paths(
    tmp_path: Path, receiver: _Receiver
) -> None:
    """``path = "t/{tenant}"``: a put per tenant, the value made safe and the template's
    ``/`` kept; a row with no tenant, and the rows of a tenant past ``max_paths``, are
    refused by name (the feeder sets them aside) and nothing of that flush is sent."""
    cfg = FlightSinkConfig(
        name="out",
        kind="flight",
        topics=["orders"],
        location=f"grpc://127.0.0.1:{receiver.port}",
        path="t/{tenant}",
        max_paths=2,
        token=TOKEN,  # type: ignore[arg-type]  # pydantic makes the SecretStr
    )
    sink = FlightSink(cfg, tmp_path)

    def rows(tenants: list[str | None], first: int) -> pa.Table:
        n = len(tenants)
        t = _rows(3, *range(first, first + n)).append_column("tenant", pa.array(tenants))
        return t.append_column("_twg_source_partition", pa.array([0] * n, pa.int32()))

    async def flush(t: pa.Table, first: int) -> None:
        await sink.write(t, Span("orders", 0, 0, first, first + t.num_rows))
        await sink.flush()

    asyncio.run(flush(rows(["a/b", "c", "a/b"], 0), 0))
    assert sorted(receiver.tables) == ["t/a_b", "t/c"]
    assert receiver.rows("t/a_b")["_twg_position"].to_pylist() == [0, 2]
    with pytest.raises(SinkRefusedError, match="max_paths = 2") as third:
        asyncio.run(flush(rows(["c", "d"], 3), 3))
    assert third.value.records == {("orders", 0): {4}}
    with pytest.raises(SinkRefusedError, match="no value for a field") as unnamed:
        asyncio.run(flush(rows(["c", None], 5), 5))
    assert unnamed.value.records == {("orders", 0): {6}}
    assert sorted(receiver.tables) == ["t/a_b", "t/c"] and len(receiver.tables["t/c"]) == 1
