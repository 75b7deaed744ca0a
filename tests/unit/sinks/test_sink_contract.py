"""The sink contract and its loader: unknown kinds, kinds not built yet, and a backend
whose package is missing are refused with a message that says what to do."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pytest

from thalweg.errors import ConfigError, ThalwegError
from thalweg.sinks import loader
from thalweg.sinks.base import (
    BufferedSink,
    Landed,
    Ranges,
    SinkBackpressureError,
    SinkError,
    SinkHealth,
    SinkSchemaError,
    SinkState,
    SinkUnavailableError,
    Span,
    merge_ranges,
)


def test_unknown_and_unbuilt_kinds_are_refused_by_name() -> None:
    with pytest.raises(
        ConfigError, match="unknown sink kind 'lake'; known: arrow_ipc, delta, flight"
    ):
        loader.load_sink_class("lake")
    for kind, entry in loader.SINKS.items():
        if entry.built:
            assert loader.load_sink_class(kind).kind == kind
        else:
            with pytest.raises(ConfigError, match=f"kind '{kind}' are not built yet"):
                loader.load_sink_class(kind)


def test_a_missing_backend_package_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A backend module whose package is absent, as pyiceberg would be without the extra.
    (tmp_path / "demo_backend_sink.py").write_text("import absent_backend_pkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(
        loader.SINKS, "demo", loader._Entry("demo_backend_sink:DemoSink", "demo", True)
    )
    with pytest.raises(ConfigError, match=r"\(absent_backend_pkg\): pip install 'thalweg\[demo\]'"):
        loader.load_sink_class("demo")


class _Memory(BufferedSink):
    """Keeps committed rows in memory; ``fail`` makes the next commit fail with it."""

    kind = "memory"
    guarantee = "exactly-once"

    def __init__(self, name: str) -> None:
        super().__init__(types.SimpleNamespace(name=name), Path("."))
        self.committed: list[pa.Table] = []
        self.fail: Exception | None = None

    def _commit(self, rows: Mapping[str, list[pa.Table]], covered: Ranges) -> None:
        if self.fail is not None:
            raise self.fail
        self.committed += [t for ts in rows.values() for t in ts]


def _rows(*offsets: int) -> pa.Table:
    return pa.table({"_twg_position": pa.array(offsets, pa.int64())})


def test_a_flush_lands_exactly_the_written_spans_merged() -> None:
    sink = _Memory("mem")

    async def go() -> Landed:
        # Position 7 has no row (a dead-lettered record): its span still counts.
        await sink.write(_rows(5, 6), Span("t", 0, 0, 5, 7))
        await sink.write(_rows(), Span("t", 0, 0, 7, 8))
        await sink.write(_rows(20), Span("t", 1, 2, 20, 21))
        return await sink.flush()

    landed = asyncio.run(go())
    assert landed.ranges == {("t", 0, 0): [(5, 8)], ("t", 1, 2): [(20, 21)]}
    assert sum(t.num_rows for t in sink.committed) == 3
    assert asyncio.run(sink.flush()).empty
    assert sink.health().state is SinkState.UP


def test_a_failed_flush_lands_nothing_and_says_why_in_health() -> None:
    sink = _Memory("mem")
    sink.fail = SinkUnavailableError("connection refused")

    async def go() -> None:
        await sink.write(_rows(1), Span("t", 0, 0, 1, 2))
        await sink.flush()

    with pytest.raises(SinkUnavailableError):
        asyncio.run(go())
    assert sink.health() == SinkHealth(SinkState.DOWN, "connection refused")
    sink.fail = None
    assert asyncio.run(sink.flush()).empty  # dropped: the feeder writes it again
    assert sink.committed == []
    sink.fail = SinkSchemaError("amount: long -> string")
    with pytest.raises(SinkSchemaError):
        asyncio.run(go())
    assert sink.health().state is SinkState.DEGRADED
    assert not SinkSchemaError("x").retriable and SinkUnavailableError("x").retriable


def test_backpressure_is_a_typed_retriable_sink_error() -> None:
    exc = SinkBackpressureError("full", retry_after_s=0.5)
    assert exc.retriable and exc.retry_after_s == 0.5 and exc.reason == "backpressure"
    assert isinstance(exc, SinkError) and isinstance(exc, ThalwegError)


def test_merge_ranges_merges_adjacent_and_overlapping_and_drops_empty() -> None:
    assert merge_ranges([(5, 8), (0, 2), (2, 3), (7, 9), (4, 4)]) == [(0, 3), (5, 9)]
