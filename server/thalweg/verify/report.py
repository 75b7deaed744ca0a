"""What ``twg verify`` found: findings per partition and per sink, as text or JSON.

A finding is an ``error`` (the lanes or a sink do not hold what the exactly-once
promise says: a position missing or held twice, a commit ahead of the lane, rows a
sink's coverage claims and its table lacks) or a ``warning`` (normal for a moment beside
a running gateway — a merge's parts awaiting their sweep, a decoded twin being rebuilt —
and worth a look when it stays). Errors decide the exit code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Level = Literal["error", "warning"]

#: Warnings that a part of the check did not run.
UNCHECKED = frozenset({"broker_unreachable", "deep_incomplete", "deep_unchecked"})


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    code: str  # stable, for tools: gap, duplicate, overlap, orphan, commit_ahead, ...
    where: str  # "orders[3]" or "sink db: orders[3]"
    message: str


@dataclass(slots=True)
class PartitionSummary:
    """One partition's figures, for the report (positions as ``[start, end)``)."""

    topic: str
    partition: int
    epoch: int
    lane: list[tuple[int, int]]
    rows: int
    floor: int = 0
    log_start: int | None = None
    log_end: int | None = None
    committed: int | None = None


@dataclass(slots=True)
class Report:
    partitions: list[PartitionSummary] = field(default_factory=list)
    sinks: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    # No process wrote the lanes while they were read (lane/liveness.py).
    stopped: bool = False
    # ``--deep``: per partition, what was compared with the broker (verify/deep.py).
    deep: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, level: Level, code: str, where: str, message: str) -> None:
        self.findings.append(Finding(level, code, where, message))

    @property
    def ok(self) -> bool:
        return not any(f.level == "error" for f in self.findings)

    @property
    def unchecked(self) -> list[Finding]:
        """The findings that say a check could not run (the cluster did not answer):
        a report ``ok`` with these has not checked everything."""
        return [f for f in self.findings if f.code in UNCHECKED]

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "stopped": self.stopped,
            "unchecked": sorted({f.code for f in self.unchecked}),
            "errors": sum(f.level == "error" for f in self.findings),
            "warnings": sum(f.level == "warning" for f in self.findings),
            "findings": [asdict(f) for f in self.findings],
            "partitions": [asdict(p) for p in self.partitions],
            "sinks": self.sinks,
            "deep": self.deep,
        }

    def as_text(self) -> str:
        lines = []
        for p in self.partitions:
            lane = ", ".join(f"{a}-{b - 1}" for a, b in p.lane) or "empty"
            broker = (
                f"; broker {p.log_start}..{p.log_end}, committed {p.committed}"
                if p.log_end is not None
                else ""
            )
            lines.append(
                f"{p.topic}[{p.partition}] epoch {p.epoch}: lane {lane} ({p.rows} rows)"
                f"{f', floor {p.floor}' if p.floor else ''}{broker}"
            )
        for name, s in self.sinks.items():
            lines.append(f"sink {name}: {s.get('summary', '')}")
        for where, d in self.deep.items():
            lines.append(
                f"deep {where}: offsets {d['from']}-{d['to'] - 1}: {d['compared']} compared "
                f"with the broker, {d['differ']} differ, {d['missing']} missing, "
                f"{d['not_retained']} no longer retained by it"
                + ("" if d["complete"] else " (incomplete)")
            )
        for f in self.findings:
            lines.append(f"{f.level.upper():7s} {f.code}: {f.where}: {f.message}")
        errors = sum(f.level == "error" for f in self.findings)
        warnings = len(self.findings) - errors
        lines.append(
            "ok: every position once, every sink agrees"
            if self.ok
            else f"NOT OK: {errors} error(s)"
        )
        if warnings:
            lines[-1] += f", {warnings} warning(s)"
        return "\n".join(lines)
