"""``twg verify --deep``: each record the broker still retains against the raw lane.

The shallow check proves every position is held once; it cannot see a record held
reshaped — a value cut short, a header lost or reordered, a null key stored as an empty
one, a timestamp shifted. This check reads the partition back from the broker and
compares key, value, headers and timestamp field by field with the raw lane's row at the
same offset.

The broker is read with aiokafka's own record parser (a plain consumer with no group:
it never joins the gateways' group), not with the gateway's columnar fetch
(``kafka.columnar_fetch``): the check is an independent decode of the same bytes, so a
fault in the gateway's unpacking cannot hide itself. The consumer takes the source's
``isolation_level``, so aborted transactions are skipped exactly as the gateway skips
them; control records are never returned. An offset the lane holds and the broker no
longer returns (topic compaction or retention since) is *not retained*, never a
mismatch. A record the broker
returns inside the lane's coverage that the lane lacks is missing.

Bounded by ``--partition`` and ``--since`` (a time: only the segments holding records
from then on are read, by their Parquet statistics). Its cost is one read of the raw
lane's five columns and one fetch of the same records: ``docs/performance.md``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from thalweg.config.models import KafkaSourceConfig
from thalweg.kafka.clients import security_kwargs
from thalweg.lane.layout import Lane, LaneLayout, Segment
from thalweg.records.columns import MetadataColumns
from thalweg.verify.report import Report

#: The fields compared, in the order a mismatch names them.
FIELDS = ("key", "value", "headers", "timestamp")
#: Offsets quoted per finding; the count is always given in full.
QUOTED = 10

Fields = tuple[bytes | None, bytes | None, tuple[tuple[bytes, bytes | None], ...], int | None]


@dataclass(slots=True)
class DeepResult:
    """One partition's deep check, for the report."""

    compared: int = 0
    not_retained: int = 0  # lane rows the broker no longer returns (compaction, retention)
    start: int = 0
    end: int = 0  # [start, end): the offsets read from both sides
    differ: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # the broker's, not in the lane
    incomplete: str | None = None  # why the broker stopped answering before ``end``


@dataclass(frozen=True, slots=True)
class DeepRange:
    """What to read of one partition: ``[start, end)`` and the segments holding it."""

    topic: str
    partition: int
    start: int
    end: int
    segments: tuple[Segment, ...]
    skip: tuple[tuple[int, int], ...] = ()  # [a, b) held by another replica


def plan_range(
    layout: LaneLayout,
    columns: MetadataColumns,
    topic: str,
    partition: int,
    bounds: tuple[int, int],
    since_ms: int | None,
    skip: Sequence[tuple[int, int]] = (),
) -> DeepRange | None:
    """The part of the partition to compare: inside ``bounds`` (the lane's coverage cut
    to the broker's log), from the first segment holding a record stamped at or after
    ``since_ms``. None when nothing is left to read."""
    start, end = bounds
    chosen: list[Segment] = []
    for seg in layout.segments(Lane.RAW, topic, partition):
        if seg.last < start or seg.first >= end:
            continue
        if since_ms is not None and not chosen and _newest_ms(seg, columns) < since_ms:
            continue  # every record in it older than --since
        chosen.append(seg)
    if not chosen:
        return None
    start = max(start, chosen[0].first)
    return DeepRange(topic, partition, start, end, tuple(chosen), tuple(skip))


def _newest_ms(seg: Segment, columns: MetadataColumns) -> int:
    """The newest record timestamp in ``seg`` by its footer's statistics (no rows read);
    a file without them reads as new (it is compared)."""
    meta = pq.ParquetFile(seg.path).metadata
    # A Parquet leaf column's index, not the Arrow field's: the headers list is two.
    leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]
    if columns.timestamp not in leaves:
        return 2**62
    index = leaves.index(columns.timestamp)
    newest = -1
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics
        if stats is None or not stats.has_min_max:
            return 2**62
        value = stats.max
        newest = max(
            newest, int(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)
        )
    return newest


def lane_rows(seg: Segment, columns: MetadataColumns, start: int, end: int) -> dict[int, Fields]:
    """``seg``'s rows in ``[start, end)``: offset → the compared fields, as Python."""
    names = [columns.offset, *(columns.source(f) for f in FIELDS)]
    table = pq.read_table(seg.path, columns=names)
    offsets = table.column(0).to_pylist()
    keys = table.column(1).to_pylist()
    values = table.column(2).to_pylist()
    headers = table.column(3).to_pylist()
    stamps = table.column(4).cast("int64").to_pylist()
    out: dict[int, Fields] = {}
    for o, k, v, h, t in zip(offsets, keys, values, headers, stamps, strict=True):
        if start <= o < end:
            out[o] = (k, v, tuple((p["key"], p["value"]) for p in h or ()), t)
    return out


def broker_fields(record: Any) -> Fields:
    """A fetched record's compared fields, in the lane's shapes (aiokafka decodes a
    header key to ``str``; the lane keeps the bytes)."""
    headers = tuple(
        (k.encode("utf-8") if isinstance(k, str) else k, v) for k, v in record.headers or ()
    )
    ts = record.timestamp if record.timestamp is not None and record.timestamp >= 0 else None
    return (record.key, record.value, headers, ts)


def differing(lane: Fields, broker: Fields) -> tuple[str, ...]:
    """The names of the fields that differ (empty: the record is held as sent)."""
    lane_ts, broker_ts = lane[3], broker[3]
    out = [f for f, a, b in zip(FIELDS[:3], lane[:3], broker[:3], strict=True) if a != b]
    if lane_ts != broker_ts and not (lane_ts in (None, -1) and broker_ts is None):
        out.append("timestamp")
    return tuple(out)


async def check_partition(
    src: KafkaSourceConfig, columns: MetadataColumns, plan: DeepRange, idle_s: float
) -> DeepResult:
    """Read ``plan``'s offsets from the broker and the lane and compare them."""
    result = DeepResult(start=plan.start, end=plan.end)
    tp = TopicPartition(plan.topic, plan.partition)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=src.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        isolation_level=src.isolation_level,
        request_timeout_ms=src.request_timeout_ms,
        fetch_max_wait_ms=100,
        **security_kwargs(src),
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, plan.start)
        carry: list[Any] = []
        for seg in plan.segments:
            lane = lane_rows(seg, columns, plan.start, plan.end)
            upto = min(seg.last + 1, plan.end)
            records, carry = await _records_until(consumer, tp, upto, carry, idle_s, result)
            for record in records:
                if any(a <= record.offset < b for a, b in plan.skip):
                    continue
                held = lane.pop(record.offset, None)
                result.compared += 1
                if held is None:
                    result.missing.append(record.offset)
                    continue
                diff = differing(held, broker_fields(record))
                if diff:
                    result.differ.append((record.offset, diff))
            result.not_retained += len(lane)
            if result.incomplete is not None:
                break
    finally:
        await consumer.stop()
    return result


async def _records_until(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    upto: int,
    carry: list[Any],
    idle_s: float,
    result: DeepResult,
) -> tuple[list[Any], list[Any]]:
    """Records below ``upto`` (``carry`` first: fetched before, past the last bound),
    and those fetched past it. Stops at ``upto`` or once the broker has returned nothing
    for ``idle_s`` (what is left is then named in ``result.incomplete``)."""
    out = [r for r in carry if r.offset < upto]
    rest = [r for r in carry if r.offset >= upto]
    if rest:
        return out, rest
    quiet_since = time.monotonic()
    while await consumer.position(tp) < upto:
        try:
            got = await consumer.getmany(tp, timeout_ms=200, max_records=10_000)
        except (KafkaError, UnicodeDecodeError) as exc:
            result.incomplete = f"the fetch from offset {await consumer.position(tp)} failed: {exc}"
            break
        batch = got.get(tp, [])
        if not batch:
            if time.monotonic() - quiet_since > idle_s:
                result.incomplete = (
                    f"the broker returned nothing from offset {await consumer.position(tp)} "
                    f"for {idle_s:.0f} s (the lane's coverage ends at {result.end})"
                )
                break
            continue
        quiet_since = time.monotonic()
        out.extend(r for r in batch if r.offset < upto)
        rest.extend(r for r in batch if r.offset >= upto)
    return out, rest


def report_partition(where: str, result: DeepResult, report: Report) -> None:
    """``result``'s findings: ``deep_mismatch`` and ``deep_missing`` are errors,
    ``deep_incomplete`` is a check that did not finish (unchecked)."""
    if result.differ:
        quoted = ", ".join(f"{o} ({'+'.join(f)})" for o, f in result.differ[:QUOTED])
        report.add(
            "error",
            "deep_mismatch",
            where,
            f"{len(result.differ)} record(s) in the raw lane differ from the broker's: "
            f"offsets {quoted}{' ...' if len(result.differ) > QUOTED else ''}",
        )
    if result.missing:
        quoted = ", ".join(map(str, result.missing[:QUOTED]))
        report.add(
            "error",
            "deep_missing",
            where,
            f"the broker returns {len(result.missing)} record(s) inside the lane's "
            f"coverage that no raw segment holds: offsets {quoted}"
            f"{' ...' if len(result.missing) > QUOTED else ''}",
        )
    if result.incomplete is not None:
        report.add("warning", "deep_incomplete", where, result.incomplete)


def run_deep(
    plans: list[tuple[KafkaSourceConfig, list[DeepRange]]],
    columns: MetadataColumns,
    report: Report,
) -> None:
    """Every planned partition compared, its findings and figures added to ``report``."""

    async def all_of(src: KafkaSourceConfig, chosen: list[DeepRange]) -> list[DeepResult]:
        idle = max(src.request_timeout_ms / 1000, 5.0)
        return [await check_partition(src, columns, plan, idle) for plan in chosen]

    for src, chosen in plans:
        try:
            results = asyncio.run(all_of(src, chosen))
        except KafkaError as exc:
            for plan in chosen:
                report.add(
                    "warning",
                    "deep_incomplete",
                    f"{plan.topic}[{plan.partition}]",
                    f"{src.bootstrap_servers}: {exc}",
                )
            continue
        for plan, result in zip(chosen, results, strict=True):
            where = f"{plan.topic}[{plan.partition}]"
            report_partition(where, result, report)
            report.deep[where] = {
                "from": result.start,
                "to": result.end,
                "compared": result.compared,
                "differ": len(result.differ),
                "missing": len(result.missing),
                "not_retained": result.not_retained,
                "complete": result.incomplete is None,
            }
