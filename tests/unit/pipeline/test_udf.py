"""WebAssembly scalar functions in node SQL: called per value, null in null out; a
runaway call is stopped by its fuel and a hungry one by the memory ceiling, failing the
batch with udf_exhausted; a module that imports any capability, or whose export does not
match the configured signature, is refused at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from thalweg.config.pipeline import NodeConfig, UdfConfig
from thalweg.errors import ConfigError
from thalweg.pipeline.dag import SqlNode
from thalweg.pipeline.udf import CHUNK, UdfExhaustedError, WasmUdf
from thalweg.records.columns import MetadataColumns

WAT = Path(__file__).resolve().parents[2] / "data" / "udfs"
COLS = MetadataColumns("_twg_")


def udf(name: str, **kw: Any) -> WasmUdf:
    body = {"name": name, "module": WAT / "math.wat", "args": ["int64"], "returns": "int64"}
    return WasmUdf(UdfConfig.model_validate({**body, **kw}))


def node(query: str, *udfs: WasmUdf, schema: pa.Schema | None = None) -> SqlNode:
    cfg = NodeConfig.model_validate({"name": "n", "from": "t", "query": query})
    return SqlNode(cfg, schema or table().schema, COLS, [u.udf for u in udfs])


def table() -> pa.Table:
    return pa.table(
        {
            "x": pa.array([1, None, 21], pa.int64()),
            "_twg_position": pa.array([0, 1, 2], pa.int64()),
            "_twg_record_id": pa.array([bytes([i]) * 16 for i in range(3)], pa.binary(16)),
        }
    )


def test_a_wasm_function_runs_in_sql_null_in_null_out() -> None:
    out = node("select double(x) as y, _twg_* from input", udf("double")).run(table())
    assert out.column("y").to_pylist() == [2, None, 42]
    ratio = udf("ratio", args=["float64", "float64"], returns="float64")
    t = pa.table({"a": [1.0, 3.0], "b": [2.0, 4.0], "_twg_position": [0, 1]})
    out = node("select ratio(a, b) as r, _twg_position from input", ratio, schema=t.schema).run(t)
    assert out.column("r").to_pylist() == [0.5, 0.75]


def test_a_runaway_call_is_stopped_by_fuel_and_memory_by_its_ceiling() -> None:
    spin = node("select spin(x) as y, _twg_* from input", udf("spin", fuel=10_000))
    with pytest.raises(Exception, match="udf_exhausted"):
        spin.run(table())
    hog = udf("hog", args=["int32"], returns="int32", max_memory_bytes=4 * 65536)
    t = pa.table({"pages": pa.array([1, 100], pa.int32()), "_twg_position": [0, 1]})
    out = node("select hog(pages) as old, _twg_position from input", hog, schema=t.schema).run(t)
    assert out.column("old").to_pylist() == [1, -1]  # the second grow refused, not granted
    # The store is still usable after a trap: the next batch runs.
    again = node("select double(x) as y, _twg_* from input", udf("double"))
    assert again.run(table()).column("y").to_pylist() == [2, None, 42]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"module": WAT / "wasi.wat", "export": "f"},
            r"imports \['wasi_snapshot_preview1\.fd_write'\]",
        ),
        ({"export": "nope"}, "exports no function 'nope'"),
        ({"export": "ratio"}, "the configuration says"),
        ({"module": WAT / "missing.wat"}, "missing.wat"),
        ({"module": WAT / "big.wat", "max_memory_bytes": 65536}, "cannot instantiate"),
        ({"export": "bad"}, r"bad_batch must take \(n, out, arg1\)"),
    ],
)
def test_modules_that_cannot_run_as_configured_are_refused_at_load(
    kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        udf("double", **kw)


def test_column_calls_give_every_value_over_several_chunks_null_in_null_out() -> None:
    """``double_batch`` takes whole columns: one call per chunk of values, the same
    answers as a call per value, nulls where an argument is null."""
    n = 2 * CHUNK + 123
    xs = [None if i % 97 == 0 else i - 5000 for i in range(n)]
    double = udf("double")
    assert double.columnar
    got = double._call_columns(pa.array(xs, pa.int64()))
    assert got.to_pylist() == [None if x is None else 2 * x for x in xs]
    ratio = udf("ratio", args=["float64", "float64"], returns="float64")
    a = pa.array([float(i) for i in range(1000)])
    b = pa.array([None if i == 7 else float(i % 13 + 1) for i in range(1000)])
    got = ratio._call_columns(a, b)
    want = [None if i == 7 else i / (i % 13 + 1) for i in range(1000)]
    assert got.to_pylist() == want


def test_a_trap_in_a_column_call_fails_the_batch_and_the_next_one_runs() -> None:
    trap = udf("trap")
    with pytest.raises(UdfExhaustedError, match="udf_exhausted"):
        trap._call_columns(pa.array([1, 2, 3], pa.int64()))
    with pytest.raises(UdfExhaustedError):
        udf("spin_neg", fuel=5_000)._call_columns(pa.array([1, -1, 2], pa.int64()))
    # A value past its share of a column call's fuel is run again alone, with the whole
    # fuel: a slow but finite value still gets its answer, a runaway one is exhausted.
    slow = udf("slow", fuel=1_000_000)
    assert slow._call_columns(pa.array([3, 50_000, 7], pa.int64())).to_pylist() == [3, 50_000, 7]
    with pytest.raises(UdfExhaustedError):
        slow._call_columns(pa.array([3, 10_000_000], pa.int64()))
    assert slow._call_columns(pa.array([2], pa.int64())).to_pylist() == [2]


def test_without_room_for_columns_in_the_memory_ceiling_values_are_called_one_by_one() -> None:
    tight = udf("double", max_memory_bytes=65536)  # the module's one page, nothing more
    got = tight._call_columns(pa.array([1, None, 3], pa.int64()))
    assert got.to_pylist() == [2, None, 6]
