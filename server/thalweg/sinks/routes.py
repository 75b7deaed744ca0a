"""One topic into many tables: a sink's ``table`` naming columns of the rows
(``"{tenant}_orders"``), so each row goes to the table its values name (docs/cdc.md).

A template is literal text and ``{name}`` fields: ``{topic}`` is the topic, any other
name a column of the rows (a payload field or a ``_twg_`` column). A table name is the
template filled in per row, every character other than a letter, a digit or ``_`` made
``_`` (as every table name of the sinks is). Work is on whole columns: one string join
and one regex replace per flush, then one filter per table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thalweg.records.columns import MetadataColumns
from thalweg.records.ranges import merge_ranges, subtract_ranges
from thalweg.sinks import fold
from thalweg.sinks.base import Ranges, SinkRefusedError, name_records

# A {name} in a sink's table name: the topic, or a column of each row.
FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_UNSAFE = r"[^A-Za-z0-9_]"


def safe_name(text: str) -> str:
    """A table name as the sinks make every one: only letters, digits and ``_``."""
    return re.sub(_UNSAFE, "_", text)


def routed(template: str) -> bool:
    """Whether ``template`` names a column (not only the topic)."""
    return bool(fields(template))


def pattern(template: str, topic: str) -> re.Pattern[str]:
    """What the names ``template`` can give for ``topic`` look like (to find the tables
    a routed sink made)."""
    out, at = [], 0
    for m in FIELD.finditer(template):
        out.append(re.escape(safe_name(template[at : m.start()])))
        out.append(re.escape(safe_name(topic)) if m.group(1) == "topic" else "[A-Za-z0-9_]+")
        at = m.end()
    out.append(re.escape(safe_name(template[at:])))
    return re.compile("^" + "".join(out) + "$")


def names(
    rows: pa.Table, template: str, topic: str, *, whole: bool = True
) -> tuple[pa.Array, str | None]:
    """The table each row names (null where it names none) and, when a field column is
    missing from the rows, why. ``whole``: the whole name made safe (a table name);
    otherwise only the values filled in, the template's own text kept (a Flight path,
    whose ``/`` separates descriptor parts)."""
    n = rows.num_rows
    parts: list[pa.Array | pa.ChunkedArray | str] = []
    at = 0
    missing = None
    for m in FIELD.finditer(template):
        parts.append(template[at : m.start()])
        name = m.group(1)
        if name == "topic":
            parts.append(topic)
        elif name not in rows.column_names:
            missing = f"the rows have no column {name!r} for the name {template!r}"
            parts.append(pa.nulls(n, pa.string()))
        else:
            value = pc.cast(rows.column(name), pa.string())
            # An empty value names nothing ("out//eu" would be "out/eu"): no value.
            value = pc.if_else(pc.equal(value, ""), pa.scalar(None, pa.string()), value)
            safe = pc.replace_substring_regex(value, pattern=_UNSAFE, replacement="_")
            parts.append(value if whole else safe)
        at = m.end()
    parts.append(template[at:])
    arrays = [p if not isinstance(p, str) else pa.array([p] * n, pa.string()) for p in parts]
    joined = pc.binary_join_element_wise(*arrays, "")
    if not whole:
        return joined, missing
    return pc.replace_substring_regex(joined, pattern=_UNSAFE, replacement="_"), missing


def split(
    rows: pa.Table, template: str, topic: str, *, whole: bool = True
) -> tuple[dict[str, pa.Table], pa.Table, str | None]:
    """The rows by the table each names; the rows that name none (a field column the
    rows lack, or a null value in it) and why."""
    named, missing = names(rows, template, topic, whole=whole)
    out = {}
    for value in pc.unique(named).drop_null().to_pylist():
        out[str(value)] = rows.filter(pc.equal(named, value))
    nulls = named.null_count
    if not nulls:
        return out, rows.slice(0, 0), None
    why = missing or f"{nulls} row(s) have no value for a field of the name {template!r}"
    return out, rows.filter(pc.is_null(named)), why


def fields(template: str) -> list[str]:
    """The columns ``template`` names (``{topic}`` is not one)."""
    return [name for name in FIELD.findall(template) if name != "topic"]


# The name of the sinks' own coverage tables and directories: never a routed name.
RESERVED = "_thalweg_coverage"


def assign(
    by_topic: Mapping[str, pa.Table],
    template: str,
    known: set[str],
    max_tables: int,
    sink: str,
    columns: MetadataColumns,
    *,
    whole: bool = True,
    deletes_name_nothing: bool = False,
) -> dict[tuple[str, str], pa.Table]:
    """Each table's rows per topic (``(name, topic)`` → rows) for a routed template, at
    most ``max_tables`` tables counting the ``known`` ones (``whole``: as
    :func:`names`). ``deletes_name_nothing`` (an upsert): a delete that names no table
    (a tombstone without its row's fields) is left out, not refused — it changes no row.

    Raises:
        SinkRefusedError: naming the records that name no table (a field missing, null
            or empty), the reserved name of the sinks' coverage, or one table past
            ``max_tables``: the feeder sets exactly those aside in the sink's dead-letter
            lane and lands the rest.
    """
    out: dict[tuple[str, str], pa.Table] = {}
    refused: dict[tuple[str, int], set[int]] = {}
    why: list[str] = []
    for topic, data in by_topic.items():
        parts, unnamed, unrouted = split(data, template, topic, whole=whole)
        if deletes_name_nothing and unnamed.num_rows:
            unnamed = unnamed.filter(pc.invert(fold.deleted(unnamed)))
        if unrouted is not None and unnamed.num_rows:
            why.append(unrouted)
            name_records(refused, topic, unnamed, columns)
        for name, part in parts.items():
            if RESERVED in name.split("/"):
                why.append(f"{part.num_rows} row(s) name {RESERVED!r}, the sink's own")
                name_records(refused, topic, part, columns)
                continue
            out[(name, topic)] = part
    names_now = {name for name, _ in out}
    new = sorted(names_now - known)
    room = max(0, max_tables - len(known))
    if len(new) > room:
        why.append(
            f"rows for {', '.join(new[room:][:3])} would take the sink past "
            f"{'max_tables' if whole else 'max_paths'} = {max_tables}"
        )
        past = set(new[room:])
        for name, topic in [k for k in out if k[0] in past]:
            name_records(refused, topic, out.pop((name, topic)), columns)
    if refused:
        raise SinkRefusedError(f"sink {sink!r}: {'; '.join(why)}", records=refused)
    return out


def not_held(
    rows: pa.Table, own: Ranges, covered: Ranges, topic: str, columns: MetadataColumns
) -> pa.Table:
    """The rows a routed table (or directory) does not hold yet: those at positions the
    flush covers (per partition and epoch) that its own coverage already holds — a
    replay after a flush was cut between its tables and its control record. Only the
    overlap of the two counts, so an earlier epoch's coverage never hides a new epoch's
    rows: rows carry no epoch, and a flush never holds two epochs of one partition (the
    feeder flushes between them, ``recovery/feeder.py``)."""
    if not own or not rows.num_rows:
        return rows
    parts = rows.column(columns.partition).to_numpy(zero_copy_only=False)
    positions = rows.column(columns.position).to_numpy(zero_copy_only=False)
    held = np.zeros(rows.num_rows, dtype=bool)
    for p in np.unique(parts):
        ranges = merge_ranges(
            [
                r
                for key, mine in own.items()
                if key[0] == topic and key[1] == p and key in covered
                for r in subtract_ranges(mine, subtract_ranges(mine, covered[key]))
            ]
        )
        if not ranges:
            continue
        starts = np.array([a for a, _ in ranges], dtype=np.int64)
        ends = np.array([b for _, b in ranges], dtype=np.int64)
        mine = parts == p
        at = np.searchsorted(starts, positions[mine], side="right") - 1
        inside = (at >= 0) & (positions[mine] < ends[np.maximum(at, 0)])
        held[np.flatnonzero(mine)[inside]] = True
    return rows.filter(pc.invert(pa.array(held))) if held.any() else rows
