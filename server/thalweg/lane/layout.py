"""Paths and names of lane files, and the lane manifest that pins the metadata prefix."""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from urllib.parse import quote, unquote

from thalweg.errors import LaneError, PrefixMismatchError
from thalweg.lane.durable import write_file_durably

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "_thalweg.json"
_SEGMENT_RE = re.compile(r"^(\d{20})-(\d{20})\.parquet$")
# Keys of the Parquet key-value metadata every segment carries.
META_PREFIX = b"thalweg.metadata_prefix"
META_COVERS_FROM = b"thalweg.covers_from"
META_COVERS_TO = b"thalweg.covers_to"
META_LANE = b"thalweg.lane"


class Lane(StrEnum):
    RAW = "raw"
    DECODED = "decoded"
    DLQ = "dlq"


@dataclass(frozen=True, slots=True)
class Segment:
    """One immutable lane file covering offsets ``first..last`` (inclusive)."""

    first: int
    last: int
    path: Path


def segment_name(first: int, last: int) -> str:
    return f"{first:020d}-{last:020d}.parquet"


RETENTION_DIR = "retention"
SQL_SNAPSHOTS_DIR = "sql-snapshots"  # files Flight SQL queries read (flight/sql/tables.py)
NODES_DIR = "nodes"  # the pipeline's node lanes and node dead letters (docs/pipeline.md)
REFUSED_DIR = "refused"  # records a sink's destination refused (docs/sinks.md)
_NODE_FILE_RE = re.compile(r"^e(\d{6})-(\d{20})-(\d{20})\.parquet$")


def _matching(directory: Path, pattern: re.Pattern[str]) -> list[re.Match[str]]:
    """The names in ``directory`` that ``pattern`` matches (none when it is absent)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [m for m in map(pattern.match, names) if m]


class LaneLayout:
    """Where everything lives under one ``data_dir``.

    A partition's segments below its retention floor (``lane.retention``) are not
    listed unless asked for: retention raises the floor first and deletes the files
    after a grace period, so a read planned before the floor rose still finds its files
    (reads by position range list every file), and nothing planned after it — coverage,
    ``earliest``, the sinks' work — sees them.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._floors: dict[tuple[str, int], tuple[int, int]] = {}  # → (mtime_ns, floor)

    def floor_path(self, topic: str, partition: int) -> Path:
        return self.root / RETENTION_DIR / f"topic={quote(topic, safe='')}" / f"{partition}.json"

    def floor(self, topic: str, partition: int) -> int:
        """The first position retention keeps (0: nothing removed); read again only when
        the marker file changed."""
        path = self.floor_path(topic, partition)
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return 0
        cached = self._floors.get((topic, partition))
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            value = int(json.loads(path.read_text(encoding="utf-8"))["floor"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LaneError(f"{path}: unreadable retention floor: {exc}") from exc
        self._floors[(topic, partition)] = (mtime, value)
        return value

    def floor_rose_at(self, topic: str, partition: int, position: int) -> float | None:
        """When the floor first rose above ``position`` (the retention record keeps each
        rise with its time until its files are swept); None once that is no longer
        recorded — the files below it are gone, or the record keeps no times."""
        try:
            body = json.loads(self.floor_path(topic, partition).read_text(encoding="utf-8"))
            steps = [(int(f), float(at)) for f, at in body.get("steps", [])]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise LaneError(
                f"{self.floor_path(topic, partition)}: unreadable floor: {exc}"
            ) from exc
        rises = [at for f, at in steps if f > position]
        return min(rises) if rises else None

    def partition_dir(self, lane: Lane, topic: str, partition: int) -> Path:
        return self.root / lane.value / f"topic={quote(topic, safe='')}" / f"partition={partition}"

    def segments(
        self,
        lane: Lane,
        topic: str,
        partition: int,
        *,
        retained: bool = True,
        contained: bool = False,
    ) -> list[Segment]:
        """The durable segments of a partition, sorted by first offset.

        With ``retained`` (the default), those at or above its retention floor; without,
        every file still on disk (a read planned before the floor rose reads the files
        below it until they are deleted). A segment whose positions lie inside another's
        — the small files a compaction merged, until they are deleted — is left out
        unless ``contained`` (start-up repair looks at them)."""
        directory = self.partition_dir(lane, topic, partition)
        out = [
            Segment(int(m[1]), int(m[2]), directory / m[0])
            for m in _matching(directory, _SEGMENT_RE)
        ]
        out.sort(key=lambda s: (s.first, -s.last))
        if not contained:
            out = _outermost(out)
        floor = self.floor(topic, partition) if retained else 0
        return [s for s in out if s.last >= floor] if floor else out

    def node_dir(self, node: str, topic: str, partition: int) -> Path:
        """A node lane's directory of one partition (``sinks.node_lane`` writes it)."""
        t = f"topic={quote(topic, safe='')}"
        return self.root / NODES_DIR / node / t / f"partition={partition}"

    def node_files(self, node: str, topic: str, partition: int) -> list[tuple[int, int, int, Path]]:
        """A node lane's files of one partition as (epoch, start, end exclusive, path), in
        order — what the lane covers is their names."""
        directory = self.node_dir(node, topic, partition)
        return sorted(
            (int(m[1]), int(m[2]), int(m[3]), directory / m[0])
            for m in _matching(directory, _NODE_FILE_RE)
        )

    def nodes(self) -> list[str]:
        """The nodes with anything on disk (a lane or dead letters)."""
        try:
            return sorted(os.listdir(self.root / NODES_DIR))
        except FileNotFoundError:
            return []

    def node_dead_letter_dir(self, node: str, topic: str, partition: int) -> Path:
        """Where a node's refused records of one partition go, one file per segment."""
        return LaneLayout(self.root / NODES_DIR / node).partition_dir(Lane.DLQ, topic, partition)

    def refused(self, sink: str) -> LaneLayout:
        """The dead-letter lane of a sink (``recovery.refused``): its ``Lane.DLQ``."""
        return LaneLayout(self.root / REFUSED_DIR / sink)

    def refused_dir(self, sink: str, topic: str, partition: int) -> Path:
        """Where the records a sink's destination refused go, one partition."""
        return self.refused(sink).partition_dir(Lane.DLQ, topic, partition)

    def refusing_sinks(self) -> list[str]:
        """The sinks with a dead-letter lane on disk."""
        try:
            return sorted(os.listdir(self.root / REFUSED_DIR))
        except FileNotFoundError:
            return []

    def topics(self) -> list[str]:
        base = self.root / Lane.RAW.value
        try:
            names = os.listdir(base)
        except FileNotFoundError:
            return []
        return sorted(unquote(n[6:]) for n in names if n.startswith("topic="))

    def partitions(self, topic: str) -> list[int]:
        base = self.root / Lane.RAW.value / f"topic={quote(topic, safe='')}"
        try:
            names = os.listdir(base)
        except FileNotFoundError:
            return []
        return sorted(int(n[10:]) for n in names if n.startswith("partition=") and n[10:].isdigit())

    def has_decoded(self, topic: str) -> bool:
        return (self.root / Lane.DECODED.value / f"topic={quote(topic, safe='')}").is_dir()

    # -- manifest ----------------------------------------------------------------------

    def claim(self, prefix: str) -> None:
        """Create the lane manifest, or refuse when it names another metadata prefix.

        Raises:
            PrefixMismatchError: the lane was written with a different prefix; mixing two
                prefixes in one lane would make its columns unreadable as one table.
        """
        raw = self.root / Lane.RAW.value
        path = raw / MANIFEST
        try:
            existing = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            existing = None
        except (OSError, ValueError) as exc:
            raise LaneError(f"{path}: unreadable lane manifest: {exc}") from exc
        if existing is not None:
            found = existing.get("metadata_prefix")
            if found != prefix:
                raise PrefixMismatchError(
                    f"{self.root}: the lane was written with metadata prefix {found!r}, "
                    f"the configuration says {prefix!r}; changing the prefix of an existing "
                    "lane is refused (use a new data_dir)"
                )
            return
        body = json.dumps({"format_version": FORMAT_VERSION, "metadata_prefix": prefix})
        write_file_durably(path, lambda tmp: tmp.write_text(body + "\n", encoding="utf-8"))


def _outermost(segments: list[Segment]) -> list[Segment]:
    """``segments`` (sorted by first, widest first) without those inside another."""
    out: list[Segment] = []
    for seg in segments:
        if out and seg.last <= out[-1].last:
            continue
        out.append(seg)
    return out
