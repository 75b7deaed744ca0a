"""Finding the records a destination refuses inside a flush it refused, by halving.

A flush is one transaction: one value the destination cannot hold (a NUL in a Postgres
``text``) refuses all of it. Landed in halves — and the refused half in halves again —
the refused records are found in about 2·log₂ n commits for one bad record among n, and
everything else lands. The commits are bounded (``budget``): when most records are
refused, what is left is refused in a few large pieces, every record still named, so a
column the destination never accepts does not cost a commit per record.

A record's rows stay together (a node below an ``unnest`` gives one record several
rows), and a piece's span is cut where its rows are cut, so what lands and what is
refused cover the flush's positions exactly once between them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.records.ranges import merge_ranges
from thalweg.sinks.base import BufferedSink, Landed, SinkRefusedError, Span

Item = tuple[pa.Table, Span]

#: Commits one isolation may make before it refuses what is left in the pieces it has.
BUDGET = 64


@dataclass
class Isolated:
    """What landed, and the pieces refused with the destination's message."""

    landed: Landed = field(default_factory=Landed)
    refused: list[tuple[list[Item], str]] = field(default_factory=list)

    def add(self, landed: Landed) -> None:
        for key, ranges in landed.ranges.items():
            self.landed.ranges[key] = merge_ranges([*self.landed.ranges.get(key, []), *ranges])


async def isolate(
    sink: BufferedSink[Any],
    items: list[Item],
    first: SinkRefusedError,
    position: str,
    budget: int = BUDGET,
) -> Isolated:
    """Land ``items`` (which ``sink`` refused whole with ``first``) piece by piece.

    Raises:
        SinkError: anything but a refusal (an outage mid-way): what landed so far is in
            the destination with its coverage, the rest is a gap read again.
    """
    out = Isolated()
    if first.records is not None:  # the destination named them: no search
        items, named = split_named(items, first.records, position)
        if named:
            out.refused.append((named, str(first)))
        if not any(t.num_rows for t, _ in items):
            return out
        try:
            out.add(await sink.land(items))
            return out
        except SinkRefusedError as exc:
            first = exc
    queue: deque[tuple[list[Item], str]] = deque()
    halves = halve(items, position)
    if halves is None:
        out.refused.append((items, str(first)))
        return out
    queue.extend((h, str(first)) for h in halves)
    while queue:
        piece, message = queue.popleft()
        if budget <= 0:
            n = sum(t.num_rows for t, _ in piece)
            out.refused.append(
                (piece, f"{message} (refused with its {n} rows: no commits left to look closer)")
            )
            continue
        budget -= 1
        try:
            out.add(await sink.land(piece))
        except SinkRefusedError as exc:
            halves = halve(piece, position)
            if halves is None:
                out.refused.append((piece, str(exc)))
            else:
                queue.extendleft((h, str(exc)) for h in reversed(halves))
    return out


def split_named(
    items: list[Item], records: Mapping[tuple[str, int], Collection[int]], position: str
) -> tuple[list[Item], list[Item]]:
    """``items`` without the rows of ``records`` (positions per topic and partition),
    and those rows; each keeps its span (what lands and what is set aside are covered
    alike)."""
    kept: list[Item] = []
    named: list[Item] = []
    for table, span in items:
        refused = records.get((span.topic, span.partition))
        if not refused or position not in table.column_names:
            kept.append((table, span))
            continue
        mask = pa.array(
            np.isin(table.column(position).to_numpy(zero_copy_only=False), list(refused))
        )
        kept.append((table.filter(pc.invert(mask)), span))
        named.append((table.filter(mask), span))
    return kept, named


def halve(items: list[Item], position: str) -> list[list[Item]] | None:
    """Two pieces of about half the rows each; None for a single record (or rows that
    cannot be told apart: no position column)."""
    if len(items) > 1:
        rows = np.cumsum([t.num_rows for t, _ in items])
        cut = int(np.searchsorted(rows, rows[-1] / 2, side="left")) + 1
        cut = min(max(cut, 1), len(items) - 1)
        return [items[:cut], items[cut:]]
    table, span = items[0]
    if table.num_rows < 2 or position not in table.column_names:
        return None
    pos = table.column(position).to_numpy(zero_copy_only=False)
    if pos[0] == pos[-1]:
        return None  # one record's rows
    mid = pos[len(pos) // 2]
    at = int(np.searchsorted(pos, mid, side="left"))
    if at == 0:
        at = int(np.searchsorted(pos, mid, side="right"))
    split = int(pos[at])
    a = Span(span.topic, span.partition, span.epoch, span.start, split)
    b = Span(span.topic, span.partition, span.epoch, split, span.end)
    return [[(table.slice(0, at), a)], [(table.slice(at), b)]]


def by_partition(
    refused: list[tuple[list[Item], str]], position: str
) -> dict[tuple[str, int], tuple[np.ndarray, list[str]]]:
    """The refused records' positions per (topic, partition), each with its message."""
    out: dict[tuple[str, int], tuple[list[np.ndarray], list[str]]] = {}
    for piece, message in refused:
        for table, span in piece:
            if not table.num_rows or position not in table.column_names:
                continue
            pos = np.unique(table.column(position).to_numpy(zero_copy_only=False))
            found = out.setdefault((span.topic, span.partition), ([], []))
            found[0].append(pos.astype(np.int64))
            found[1].extend([message] * len(pos))
    return {k: (np.concatenate(p), m) for k, (p, m) in out.items()}
