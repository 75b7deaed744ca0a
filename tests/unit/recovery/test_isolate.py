"""Finding the records a destination refuses inside a refused flush, by halving: what
lands and what is refused cover the flush's positions exactly once between them, one bad
record among n costs about 2·log₂ n commits, a record's rows stay together, and the
commits are bounded when most records are refused.

The destination here is a small ``BufferedSink`` that refuses (as an Arrow conversion
would) any commit holding a row whose ``v`` is negative — the real destinations' refusals
(a NUL in Postgres text) are tested in ``tests/integration/test_sinks.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from thalweg.records.ranges import merge_ranges
from thalweg.recovery.isolate import BUDGET, by_partition, halve, isolate
from thalweg.sinks.base import BufferedSink, Ranges, SinkRefusedError, Span

POS = "_twg_position"


class Picky(BufferedSink):
    kind = "picky"
    guarantee = "exactly-once"

    def __init__(self) -> None:
        super().__init__(SimpleNamespace(name="picky"), Path("."))
        self.rows: list[int] = []
        self.covered: list[tuple[int, int]] = []
        self.commits = 0

    def _commit(self, rows: Mapping[str, list[pa.Table]], covered: Ranges) -> None:
        self.commits += 1
        tables = [t for ts in rows.values() for t in ts]
        if any(pc.any(pc.less(t.column("v"), 0)).as_py() for t in tables if t.num_rows):
            raise pa.ArrowInvalid("value out of range")
        for t in tables:
            self.rows += t.column(POS).to_pylist()
        for ranges in covered.values():
            self.covered += ranges


def items(positions: list[int], bad: set[int], per_item: int, rows_per: int = 1) -> list:
    out = []
    for i in range(0, len(positions), per_item):
        chunk = positions[i : i + per_item]
        pos = np.repeat(chunk, rows_per)
        v = np.array([-1 if p in bad else p for p in pos])
        table = pa.table({POS: pa.array(pos, pa.int64()), "v": pa.array(v, pa.int64())})
        end = positions[i + per_item] if i + per_item < len(positions) else chunk[-1] + 1
        out.append((table, Span("t", 0, 0, chunk[0], end)))
    return out


def run(sink: Picky, got: list) -> tuple:
    first = SinkRefusedError("refused whole")
    return asyncio.run(isolate(sink, got, first, POS))


@pytest.mark.parametrize("per_item", [1, 7, 1000])
def test_one_bad_record_is_found_and_everything_else_lands_exactly(per_item: int) -> None:
    positions = list(range(1000))
    sink = Picky()
    out = run(sink, items(positions, {613}, per_item))
    refused = by_partition(out.refused, POS)
    assert list(refused[("t", 0)][0]) == [613]
    assert sorted(sink.rows) == [p for p in positions if p != 613]
    assert len(sink.rows) == len(set(sink.rows))
    landed = merge_ranges(out.landed.ranges[("t", 0, 0)])
    refused_spans = [s for piece, _ in out.refused for _, s in piece]
    # Landed and refused spans together cover the flush exactly once.
    assert merge_ranges([*landed, *((s.start, s.end) for s in refused_spans)]) == [(0, 1000)]
    assert sum(b - a for a, b in landed) + sum(s.end - s.start for s in refused_spans) == 1000
    assert sink.commits <= 2 * int(np.ceil(np.log2(1000))) + 1


def test_a_records_rows_stay_together() -> None:
    sink = Picky()
    out = run(sink, items(list(range(50)), {20}, per_item=50, rows_per=3))
    [(piece, _)] = out.refused
    [(table, span)] = piece
    assert table.column(POS).to_pylist() == [20, 20, 20]
    assert (span.start, span.end) == (20, 21)
    assert sorted(set(sink.rows)) == [p for p in range(50) if p != 20]


def test_when_most_records_are_refused_the_commits_are_bounded_and_all_named() -> None:
    positions = list(range(5000))
    bad = set(range(0, 5000, 2))
    sink = Picky()
    out = run(sink, items(positions, bad, per_item=100))
    assert sink.commits == BUDGET
    refused = set(by_partition(out.refused, POS)[("t", 0)][0].tolist())
    assert bad <= refused  # every bad record named; some good ones refused with them
    assert refused.isdisjoint(sink.rows)
    assert refused | set(sink.rows) == set(positions)
    assert any("no commits left" in m for _, m in out.refused)


def test_a_single_record_cannot_be_halved() -> None:
    [one] = items([5], {5}, per_item=1)
    assert halve([one], POS) is None
    assert halve([(one[0].drop_columns([POS]), one[1])], POS) is None


class Naming(Picky):
    """A destination that names the records it refuses (as a routed sink does for rows
    past its table ceiling): no search, one commit for the rest."""

    def _commit(self, rows: Mapping[str, list[pa.Table]], covered: Ranges) -> None:
        tables = [t for ts in rows.values() for t in ts if t.num_rows]
        bad = {
            p
            for t in tables
            for p, v in zip(t[POS].to_pylist(), t["v"].to_pylist(), strict=True)
            if v < 0
        }
        if bad:
            self.commits += 1
            raise SinkRefusedError("past the ceiling", records={("t", 0): bad})
        super()._commit(rows, covered)


def test_records_the_destination_names_are_set_aside_without_a_search() -> None:
    bad = {3, 40, 41, 77}
    found_items = items(list(range(100)), bad, per_item=10)
    sink = Naming()
    refused_first = SinkRefusedError("past the ceiling", records={("t", 0): bad})
    found = asyncio.run(isolate(sink, found_items, refused_first, POS))
    assert sink.commits == 1  # the rest landed at once
    assert sorted(sink.rows) == [p for p in range(100) if p not in bad]
    positions, messages = by_partition(found.refused, POS)[("t", 0)]
    assert sorted(positions.tolist()) == sorted(bad) and set(messages) == {"past the ceiling"}
    assert merge_ranges(sink.covered) == [(0, 100)]  # every position covered once
