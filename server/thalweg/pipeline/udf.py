"""WebAssembly scalar functions for node SQL (wasmtime; ``docs/pipeline.md``).

A user's ``.wasm`` (or ``.wat``) module is compiled at start and its export registered
with DataFusion under the configured name — nothing is rebuilt. It runs with no
capabilities: the module is linked against nothing, so one that imports anything (WASI's
files, sockets or clock included) is refused at start. Each call gets ``fuel``
instructions and the instance at most ``max_memory_bytes`` of linear memory; a call past
either raises :class:`UdfExhaustedError`: the record is dead-lettered with reason
``udf_exhausted`` (the chain isolates it from the rest of its batch) and the gateway
stays up.

Numbers only (``int32``, ``int64``, ``float32``, ``float64``): that is what a core wasm
function takes and returns without a memory protocol. A null argument gives a null.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import wasmtime
from datafusion import ScalarUDF, udf

from thalweg.config.pipeline import UdfConfig
from thalweg.errors import ConfigError
from thalweg.pipeline.dag import RowsRefusedError

_ARROW = {
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
}
_WASM = {
    "int32": wasmtime.ValType.i32(),
    "int64": wasmtime.ValType.i64(),
    "float32": wasmtime.ValType.f32(),
    "float64": wasmtime.ValType.f64(),
}


class UdfExhaustedError(RowsRefusedError):
    """A WebAssembly function ran out of fuel or memory, or trapped, on a value: its
    record is dead-lettered with this reason (the error crosses DataFusion as text;
    ``thalweg.pipeline.dag`` reads it back)."""

    reason = "udf_exhausted"


class WasmUdf:
    """One configured function, compiled and instantiated once.

    Raises:
        ConfigError: the module does not compile, imports anything, lacks the export,
            or the export's signature is not ``args -> returns``.
    """

    def __init__(self, cfg: UdfConfig) -> None:
        self.name = cfg.name
        self._fuel = cfg.fuel
        where = f"pipeline.udfs.{cfg.name}"
        config = wasmtime.Config()
        config.consume_fuel = True
        self._engine = wasmtime.Engine(config)
        try:
            if cfg.module.suffix == ".wat":
                module = wasmtime.Module(self._engine, cfg.module.read_text(encoding="utf-8"))
            else:
                module = wasmtime.Module.from_file(self._engine, str(cfg.module))
        except (OSError, wasmtime.WasmtimeError) as exc:
            raise ConfigError(f"{where}: {cfg.module}: {str(exc).splitlines()[0]}") from exc
        if module.imports:
            names = [f"{i.module}.{i.name}" for i in module.imports]
            raise ConfigError(
                f"{where}: the module imports {names}; functions run with no capabilities "
                "(no WASI: no files, sockets or clock)"
            )
        self._module = module
        self._max_memory = cfg.max_memory_bytes
        export = cfg.export or cfg.name
        try:
            func = self._instantiate(export)
        except wasmtime.WasmtimeError as exc:  # a start-up memory past the ceiling, a trap
            raise ConfigError(f"{where}: cannot instantiate: {str(exc).splitlines()[0]}") from exc
        if func is None:
            raise ConfigError(f"{where}: the module exports no function {export!r}")
        ftype = func.type(self._store)
        want_params = [_WASM[a] for a in cfg.args]
        if list(ftype.params) != want_params or list(ftype.results) != [_WASM[cfg.returns]]:
            raise ConfigError(
                f"{where}: {export} is {list(map(str, ftype.params))} -> "
                f"{list(map(str, ftype.results))}, the configuration says {cfg.args} -> "
                f"{cfg.returns}"
            )
        self._export = export
        self._func = func
        self._lock = threading.Lock()
        self._returns = _ARROW[cfg.returns]
        self.udf: ScalarUDF = udf(
            self._call, [_ARROW[a] for a in cfg.args], self._returns, "immutable", cfg.name
        )

    def _instantiate(self, export: str) -> wasmtime.Func | None:
        """A new store and instance (memory ceiling, fuel on); the export, if a function."""
        self._store = wasmtime.Store(self._engine)
        self._store.set_limits(memory_size=self._max_memory)
        self._store.set_fuel(self._fuel)
        instance = wasmtime.Linker(self._engine).instantiate(self._store, self._module)
        func = instance.exports(self._store).get(export)
        return func if isinstance(func, wasmtime.Func) else None

    def _call(self, *arrays: pa.Array) -> pa.Array:
        columns = [a.to_pylist() for a in arrays]
        out: list[Any] = []
        with self._lock:  # a Store is one thread's at a time
            for values in zip(*columns, strict=True):
                if any(v is None for v in values):
                    out.append(None)
                    continue
                self._store.set_fuel(self._fuel)
                try:
                    out.append(self._func(self._store, *values))
                except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
                    # A trap can leave the instance half-unwound (a compiled language's
                    # stack pointer in linear memory): the next call gets a fresh one.
                    fresh = self._instantiate(self._export)
                    assert fresh is not None
                    self._func = fresh
                    raise UdfExhaustedError(
                        f"pipeline.udfs.{self.name}: udf_exhausted: {str(exc).splitlines()[0]}"
                    ) from exc
        return pa.array(out, self._returns)


def load_udfs(cfgs: list[UdfConfig]) -> list[WasmUdf]:
    return [WasmUdf(c) for c in cfgs]
