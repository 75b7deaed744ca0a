"""The sink contract and its loader: unknown kinds, kinds not built yet, and a backend
whose package is missing are refused with a message that says what to do."""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path

import pyarrow as pa
import pytest

from thalweg.errors import ConfigError, ThalwegError
from thalweg.sinks import loader
from thalweg.sinks.base import Landed, Sink, SinkBackpressureError, SinkHealth, SinkState


def test_unknown_and_unbuilt_kinds_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="unknown sink kind 'lake'; known: arrow_ipc, flight"):
        loader.load_sink_class("lake")
    for kind in loader.SINKS:
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


class _Memory(Sink):
    """A sink that keeps batches in memory: the smallest thing that meets the contract."""

    kind = "memory"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._pending: list[pa.RecordBatch] = []
        self.full = False

    async def write(self, batch: pa.RecordBatch) -> None:
        if self.full:
            raise SinkBackpressureError("full", retry_after_s=0.5)
        self._pending.append(batch)

    async def flush(self) -> Landed:
        landed: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for b in self._pending:
            key = (
                b.column("_twg_source_topic")[0].as_py(),
                b.column("_twg_source_partition")[0].as_py(),
            )
            offs = b.column("_twg_source_offset").to_pylist()
            landed.setdefault(key, []).append((min(offs), max(offs) + 1))
        self._pending.clear()
        return Landed(landed)

    async def close(self) -> None:
        self._pending.clear()

    def health(self) -> SinkHealth:
        return SinkHealth(SinkState.DOWN if self.full else SinkState.UP)


def test_a_sink_reports_exactly_what_landed_and_backpressure_is_typed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "thalweg_test_memory_sink", types.SimpleNamespace(M=_Memory))
    monkeypatch.setitem(
        loader.SINKS, "memory", loader._Entry("thalweg_test_memory_sink:M", None, True)
    )
    sink = loader.load_sink_class("memory")("mem")
    batch = pa.record_batch(
        {
            "_twg_source_topic": ["t"] * 3,
            "_twg_source_partition": [0] * 3,
            "_twg_source_offset": [5, 6, 7],
        }
    )
    asyncio.run(sink.write(batch))
    landed = asyncio.run(sink.flush())
    assert landed.ranges == {("t", 0): [(5, 8)]} and not landed.empty
    assert asyncio.run(sink.flush()).empty
    sink.full = True  # type: ignore[attr-defined]
    with pytest.raises(SinkBackpressureError) as info:
        asyncio.run(sink.write(batch))
    assert info.value.retriable and info.value.retry_after_s == 0.5
    assert isinstance(info.value, ThalwegError)
    assert sink.health().state is SinkState.DOWN
