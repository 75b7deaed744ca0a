"""WebAssembly scalar functions for node SQL (wasmtime; ``docs/pipeline.md``).

A user's ``.wasm`` (or ``.wat``) module is compiled at start and its export registered
with DataFusion under the configured name — nothing is rebuilt. It runs with no
capabilities: the module is linked against nothing, so one that imports anything (WASI's
files, sockets or clock included) is refused at start. Each value gets ``fuel``
instructions and the instance at most ``max_memory_bytes`` of linear memory; a value
past either raises :class:`UdfExhaustedError`: the record is dead-lettered with reason
``udf_exhausted`` (the chain isolates it from the rest of its batch) and the gateway
stays up.

Numbers only (``int32``, ``int64``, ``float32``, ``float64``). Two ways to be called
(ADR 0033):

* **Columns** — the module exports ``memory`` and ``<export>_batch(n, out, arg1, ...)``
  (all ``i32``): the host writes each argument column's ``n`` values as a little-endian
  array into pages of linear memory it grew for them, calls once per chunk of up to
  :data:`CHUNK` values, and reads ``n`` results from ``out``. Fuel is given as
  :data:`FAST_FUEL` a value (at most ``fuel``) for the chunk; a chunk that runs out is
  run again value by value with ``fuel`` each through ``<export>``, so a value's
  ceiling is exactly ``fuel`` and a runaway value is still found alone. Measured: a call
  per value ran 19-22 k values/s; a call per chunk runs at pyarrow.compute's order.
* **Values** — only ``<export>``: one call per value (slow: for small inputs).

A null argument gives a null (the call sees 0 in its place).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import wasmtime
from datafusion import ScalarUDF, udf

from thalweg.config.pipeline import UdfConfig
from thalweg.errors import ConfigError
from thalweg.pipeline.dag import RowsRefusedError

log = logging.getLogger(__name__)

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


CHUNK = 16_384  # values a column call takes: 128 KiB an int64 column
FAST_FUEL = 10_000  # instructions a value may use in a column call before it is retried alone
_PAGE = 65_536
_NUMPY = {"int32": np.int32, "int64": np.int64, "float32": np.float32, "float64": np.float64}


@dataclass(slots=True)
class _Instance:
    """One instantiation of the module: its store, exports and the pages the host grew
    for column calls (``base``, room for ``capacity`` values of every column)."""

    store: wasmtime.Store
    func: wasmtime.Func
    batch: wasmtime.Func | None
    memory: wasmtime.Memory | None
    base: int = 0
    capacity: int = 0


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
        self._export = cfg.export or cfg.name
        self._args = list(cfg.args)
        self._returns_name = cfg.returns
        try:
            inst = self._instantiate()
        except wasmtime.WasmtimeError as exc:  # a start-up memory past the ceiling, a trap
            raise ConfigError(f"{where}: cannot instantiate: {str(exc).splitlines()[0]}") from exc
        if inst is None:
            raise ConfigError(f"{where}: the module exports no function {self._export!r}")
        ftype = inst.func.type(inst.store)
        want_params = [_WASM[a] for a in cfg.args]
        if list(ftype.params) != want_params or list(ftype.results) != [_WASM[cfg.returns]]:
            raise ConfigError(
                f"{where}: {self._export} is {list(map(str, ftype.params))} -> "
                f"{list(map(str, ftype.results))}, the configuration says {cfg.args} -> "
                f"{cfg.returns}"
            )
        if inst.batch is not None:
            btype = inst.batch.type(inst.store)
            want = [wasmtime.ValType.i32()] * (len(cfg.args) + 2)
            if list(btype.params) != want or list(btype.results):
                raise ConfigError(
                    f"{where}: {self._export}_batch must take (n, out, "
                    f"{', '.join(f'arg{i + 1}' for i in range(len(cfg.args)))}) as i32 and "
                    f"return nothing; it is {list(map(str, btype.params))} -> "
                    f"{list(map(str, btype.results))}"
                )
            if inst.memory is None:
                raise ConfigError(f"{where}: {self._export}_batch needs an exported 'memory'")
        self._inst = inst
        self.columnar = inst.batch is not None
        self._lock = threading.Lock()
        self._returns = _ARROW[cfg.returns]
        call = self._call_columns if self.columnar else self._call_values
        self.udf: ScalarUDF = udf(
            call, [_ARROW[a] for a in cfg.args], self._returns, "immutable", cfg.name
        )

    def _instantiate(self) -> _Instance | None:
        """A new store and instance (memory ceiling, fuel on); None without the export."""
        store = wasmtime.Store(self._engine)
        store.set_limits(memory_size=self._max_memory)
        store.set_fuel(self._fuel)
        instance = wasmtime.Linker(self._engine).instantiate(store, self._module)
        exports = instance.exports(store)
        func = exports.get(self._export)
        if not isinstance(func, wasmtime.Func):
            return None
        batch = exports.get(f"{self._export}_batch")
        memory = exports.get("memory")
        return _Instance(
            store,
            func,
            batch if isinstance(batch, wasmtime.Func) else None,
            memory if isinstance(memory, wasmtime.Memory) else None,
        )

    def _fresh(self, exc: BaseException) -> UdfExhaustedError:
        """After a trap: a new instance (a trap can leave one half-unwound: a compiled
        language's stack pointer in linear memory), and the error for the record."""
        fresh = self._instantiate()
        if fresh is not None:  # it had the export at start: it has it now
            self._inst = fresh
        return UdfExhaustedError(
            f"pipeline.udfs.{self.name}: udf_exhausted: {str(exc).splitlines()[0]}"
        )

    def _call_values(self, *arrays: pa.Array) -> pa.Array:
        """One call per value."""
        columns = [a.to_pylist() for a in arrays]
        with self._lock:  # a Store is one thread's at a time
            out = self._values(list(zip(*columns, strict=True)))
        return pa.array(out, self._returns)

    def _values(self, rows: list[tuple[Any, ...]]) -> list[Any]:
        out: list[Any] = []
        inst = self._inst
        for values in rows:
            if any(v is None for v in values):
                out.append(None)
                continue
            inst.store.set_fuel(self._fuel)
            try:
                out.append(inst.func(inst.store, *values))
            except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
                raise self._fresh(exc) from exc
        return out

    def _call_columns(self, *arrays: pa.Array) -> pa.Array:
        """Whole columns through linear memory, one call per chunk of values."""
        n = len(arrays[0])
        valid = np.ones(n, dtype=bool)
        columns = []
        for a, kind in zip(arrays, self._args, strict=True):
            filled = a
            if a.null_count:
                valid &= a.is_valid().to_numpy(zero_copy_only=False)
                filled = a.fill_null(0)
            values = filled.to_numpy(zero_copy_only=False)
            columns.append(np.ascontiguousarray(values, dtype=_NUMPY[kind]))
        out = np.empty(n, dtype=_NUMPY[self._returns_name])
        with self._lock:
            for start in range(0, n, CHUNK):
                stop = min(n, start + CHUNK)
                out[start:stop] = self._chunk([c[start:stop] for c in columns], valid[start:stop])
        mask = None if valid.all() else ~valid
        return pa.array(out, self._returns, mask=mask)

    def _chunk(self, columns: list[np.ndarray], valid: np.ndarray) -> np.ndarray:
        """One column call; on running out of fuel, the chunk value by value (each with
        the whole ``fuel``), which also isolates a runaway value."""
        m = len(columns[0])
        result_type = _NUMPY[self._returns_name]
        inst = self._inst
        memory, batch = inst.memory, inst.batch
        if memory is None or batch is None or not self._room(inst, memory, m):
            return self._one_by_one(columns, valid)
        stride = inst.capacity * 8  # room for any of the four types, every column alike
        pointers = [inst.base + i * stride for i in range(len(columns) + 1)]
        try:
            view = np.frombuffer(memoryview(memory.get_buffer_ptr(inst.store)), np.uint8)
            for col, at in zip(columns, pointers, strict=False):
                raw = col.view(np.uint8)
                view[at : at + raw.size] = raw
            inst.store.set_fuel(min(self._fuel, FAST_FUEL) * m)
            batch(inst.store, m, pointers[-1], *pointers[:-1])
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            if not _out_of_fuel(exc):
                raise self._fresh(exc) from exc
            self._inst = self._instantiate() or inst
            return self._one_by_one(columns, valid)
        nbytes = m * np.dtype(result_type).itemsize
        result = memoryview(memory.get_buffer_ptr(inst.store))
        got = np.frombuffer(result, dtype=np.uint8, count=nbytes, offset=pointers[-1])
        return got.view(result_type).copy()

    def _one_by_one(self, columns: list[np.ndarray], valid: np.ndarray) -> np.ndarray:
        """A chunk through ``<export>``, a call per value (nulls stay 0: masked)."""
        m = len(columns[0])
        rows = [tuple(c[i].item() for c in columns) if valid[i] else (None,) for i in range(m)]
        got = self._values(rows)
        return np.array([0 if v is None else v for v in got], dtype=_NUMPY[self._returns_name])

    def _room(self, inst: _Instance, memory: wasmtime.Memory, m: int) -> bool:
        """Pages of the instance's memory for ``m`` values of every argument and the
        result, grown once and used by the host alone; False when the memory ceiling
        leaves no room for them (the values are then called one by one)."""
        if inst.capacity >= m:
            return True
        if inst.capacity < 0:
            return False
        want = (len(self._args) + 1) * CHUNK * 8
        try:
            old = memory.grow(inst.store, -(-want // _PAGE))
        except wasmtime.WasmtimeError:
            log.warning(
                "pipeline.udfs.%s: max_memory_bytes leaves no room for column calls "
                "(%d bytes more); calling it once per value",
                self.name,
                want,
            )
            inst.capacity = -1
            return False
        inst.base, inst.capacity = old * _PAGE, CHUNK
        return True


def _out_of_fuel(exc: BaseException) -> bool:
    """A trap for fuel (the chunk is retried value by value), not a fault of the code."""
    code = getattr(exc, "trap_code", None)
    if code is not None:
        return bool(code == wasmtime.TrapCode.OUT_OF_FUEL)
    return "fuel" in str(exc)


def load_udfs(cfgs: list[UdfConfig]) -> list[WasmUdf]:
    return [WasmUdf(c) for c in cfgs]
