"""Range algebra over source positions: sorted, half-open ``[from, to)`` ranges.

What the raw lane covers, what a sink's coverage rows hold, what verify compares: all
are lists of such ranges, merged and subtracted here. Pure: no I/O, no Arrow.
"""

from __future__ import annotations


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted half-open ranges, overlapping and adjacent ones merged, empty ones dropped."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def subtract_ranges(
    ranges: list[tuple[int, int]], held: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The parts of ``ranges`` outside ``held`` (both sorted and merged)."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        pos = a
        for c, d in held:
            if d <= pos or c >= b:
                continue
            if c > pos:
                out.append((pos, c))
            pos = max(pos, d)
            if pos >= b:
                break
        if pos < b:
            out.append((pos, b))
    return out
