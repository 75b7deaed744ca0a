"""Durable segment writes: temp file → fsync → atomic rename → directory fsync.

The rename is the commit point of the raw lane. After :meth:`SegmentWriter.write` returns
the segment survives a crash or power loss, and only then may the engine commit the
source position past it. Rows that failed to decode are first written to the dead-letter
lane (``dlq/``, same name). The decoded segment is written next, so a raw segment on disk
implies its decoded sibling (barring a decode-write failure, which start-up repairs);
an orphaned decoded segment (crash between the two renames) is removed at start-up.

A raw segment is never overwritten and never written beside another that overlaps its
offsets: the final step links the temp file to its name, which fails when the name
exists, after a check of the partition's other names. And every rename first asks the
caller's *fence* whether this member still owns the partition (a member paused past its
group session must not write what the next owner writes too).

Its length: the raw, decoded and dead-letter writes of one segment and their shared
commit point (the durable write itself is ``lane/durable.py``'s).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from thalweg.codecs.base import DecodeFailure, DecodeReason
from thalweg.config.models import RawLaneConfig
from thalweg.errors import InvariantError, LaneError, SegmentConflictError, UnwritableSegmentError
from thalweg.lane.durable import prepare, publish
from thalweg.lane.layout import (
    META_COVERS_FROM,
    META_COVERS_TO,
    META_LANE,
    META_PREFIX,
    Lane,
    LaneLayout,
    Segment,
    segment_name,
)
from thalweg.lane.origin import record_origin
from thalweg.lane.read.cache import SegmentCache
from thalweg.lane.read.shape import few_chunks
from thalweg.records.columns import MetadataColumns
from thalweg.records.file_rows import row_bytes

log = logging.getLogger(__name__)

_ROW_GROUP = 128 * 1024

Fence = Callable[[], None]
"""Raises (``OwnershipLostError``) when the partition may no longer be this member's."""


# Encodes a decoded segment while the calling thread encodes its raw twin.
_ENCODERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="twg-encode")


def _discard(encoding: Future[Path] | None) -> None:
    """Wait for an encoding no longer wanted and remove its temp file."""
    if encoding is None:
        return
    with contextlib.suppress(BaseException):
        encoding.result().unlink(missing_ok=True)


def _no_fence() -> None:
    return None


@dataclass(frozen=True, slots=True)
class WrittenSegment:
    """What one durable write produced."""

    segment: Segment
    rows: int
    bytes: int
    covers_from: int
    covers_to: int
    decoded_ok: bool
    dlq_rows: int = 0
    dead: pa.Table | None = None  # the dead-letter rows, for a Kafka DLQ topic


def _reason(text: str) -> DecodeReason:
    """The reason an error column's text names (``unsupported`` for text no reason
    spells: a table from an older version)."""
    try:
        return DecodeReason(text)
    except ValueError:
        return DecodeReason.UNSUPPORTED


class SegmentWriter:
    """Writes paired raw/decoded segments for one lane root."""

    def __init__(
        self,
        layout: LaneLayout,
        columns: MetadataColumns,
        cfg: RawLaneConfig,
        cache: SegmentCache | None = None,
    ) -> None:
        self._layout = layout
        self._columns = columns
        self._cfg = cfg
        self._cache = cache
        c = columns
        self._dictionary = [c.source("cluster"), c.topic, c.source("timestamp_type")]
        self._stats = [c.position, c.timestamp, c.partition]
        # Columns of the decoded lane whose min/max prune nothing: record ids are hashes,
        # message ids opaque, and a table (Flight SQL, a lane directory) is one topic of
        # one cluster. Their statistics took a third of a decoded segment's write (60 of
        # 200 ms per 400k file rows: every value compared as bytes).
        self._no_stats = {c.record_id, c.source("message_id"), c.source("cluster"), c.topic}
        # Partitions whose lane this writer has seen begun (lane/origin.py): one listing
        # per partition per process, not one per segment.
        self._begun: set[tuple[str, int]] = set()

    def write(
        self,
        topic: str,
        partition: int,
        raw: pa.Table,
        decoded: pa.Table | None,
        covers_from: int,
        covers_to: int,
        fence: Fence = _no_fence,
        failures: Sequence[DecodeFailure] | None = None,
    ) -> WrittenSegment:
        """Make ``raw`` (and ``decoded``) durable as one segment.

        Args:
            fence: called before every rename; what it raises stops the write there.
            failures: the rows of ``decoded`` that did not decode, reasons typed (the
                decode stage's own record); None: read from ``decoded``'s error column
                (a table built outside the decode stage).
            covers_from: first source position this segment accounts for (may be below the
                first record's offset when the broker skipped offsets: compaction,
                transaction markers).
            covers_to: the position after the last record (exclusive end).

        Raises:
            LaneError: the raw segment could not be made durable (retriable).
            SegmentConflictError: another file of the lane holds these offsets.
            OwnershipLostError: (from ``fence``) nothing more may be written.
        """
        # A segment of the live tail is a hundred small fetched batches: combined, it is
        # written, copied and cached in half the CPU (and read back as whole columns).
        raw = few_chunks(raw)
        decoded = few_chunks(decoded) if decoded is not None else None
        offsets = raw.column(self._columns.position)
        first, last = int(offsets[0].as_py()), int(offsets[-1].as_py())
        name = segment_name(first, last)
        meta = {
            META_PREFIX: self._columns.prefix.encode(),
            META_COVERS_FROM: str(covers_from).encode(),
            META_COVERS_TO: str(covers_to).encode(),
        }
        # File rows (records.file_rows): their fields exist only in the decoded lane and
        # the file, so that segment is as necessary as the raw one, and their dead
        # letters take their bytes from the payload column the raw lane does not keep.
        file_rows = self._columns.payload in raw.column_names
        dead = None
        if decoded is not None:
            dead = self._dead_letters(raw, decoded, failures)
            if dead is not None:
                dlq = self._layout.partition_dir(Lane.DLQ, topic, partition) / name
                self._write_dead(dead, dlq, meta, fence)
        dlq_rows = dead.num_rows if dead is not None else 0
        decoded_ok = decoded is not None
        if file_rows:
            raw = raw.drop_columns([self._columns.payload])
        dpath = self._layout.partition_dir(Lane.DECODED, topic, partition) / name
        path = self._layout.partition_dir(Lane.RAW, topic, partition) / name
        # Both files are encoded at once (pq.write_table releases the GIL: the second core
        # works too), then published in the order that keeps a raw segment's decoded twin
        # on disk before it.
        encoding: Future[Path] | None = None
        if decoded is not None:
            encoding = _ENCODERS.submit(
                self._prepare,
                decoded,
                dpath,
                {**meta, META_LANE: b"decoded"},
                stats=False,
                codec=self._cfg.decoded_compression,
            )
        try:
            rtmp = self._prepare(raw, path, {**meta, META_LANE: b"raw"}, stats=True)
        except BaseException as exc:
            _discard(encoding)
            if isinstance(exc, (OSError, pa.ArrowException)):
                self._make_room(exc)
                raise _not_written("raw", path, exc) from exc
            raise
        if encoding is not None:
            if decoded is None:
                raise InvariantError("decoded is not set")
            try:
                decoded_ok = self._publish_decoded(encoding, dpath, decoded, fence, file_rows)
            except BaseException:  # the fence, or file rows without their fields
                rtmp.unlink(missing_ok=True)
                raise
        try:
            size = self._publish(
                rtmp,
                path,
                lambda: self._fenced_free(fence, topic, partition, first, last, covers_from),
                exclusive=True,
            )
        except SegmentConflictError:
            raise
        except (OSError, pa.ArrowException) as exc:
            self._make_room(exc)
            raise _not_written("raw", path, exc) from exc
        self._keep(path, raw)
        return WrittenSegment(
            Segment(first, last, path),
            raw.num_rows,
            size,
            covers_from,
            covers_to,
            decoded_ok,
            dlq_rows,
            dead if decoded is not None else None,
        )

    def _note_origin(self, topic: str, partition: int, covers_from: int) -> None:
        """Record where the lane begins before its first raw segment lands
        (lane/origin.py); past the fence, so a writer that lost the partition never does."""
        key = (topic, partition)
        if key in self._begun:
            return
        if not self._layout.segments(Lane.RAW, topic, partition, retained=False, contained=True):
            record_origin(self._layout, topic, partition, covers_from)
        self._begun.add(key)

    def write_decoded(
        self, topic: str, partition: int, raw_segment: Segment, decoded: pa.Table
    ) -> None:
        """Rebuild the decoded twin of an existing raw segment (start-up repair); the raw
        segment itself is never written again."""
        meta = dict(pq.read_schema(raw_segment.path).metadata or {})
        keep = {k: v for k, v in meta.items() if k.startswith(b"thalweg.")}
        path = self._layout.partition_dir(Lane.DECODED, topic, partition) / raw_segment.path.name
        self._durable(
            decoded,
            path,
            {**keep, META_LANE: b"decoded"},
            stats=False,
            codec=self._cfg.decoded_compression,
        )

    def _fenced_free(
        self, fence: Fence, topic: str, partition: int, first: int, last: int, covers_from: int
    ) -> None:
        fence()
        self._check_free(topic, partition, first, last)
        self._note_origin(topic, partition, covers_from)

    def _check_free(self, topic: str, partition: int, first: int, last: int) -> None:
        """Refuse a raw segment whose offsets another file of the partition holds."""
        for seg in self._layout.segments(Lane.RAW, topic, partition):
            if seg.first <= last and seg.last >= first:
                raise SegmentConflictError(
                    f"raw segment {topic}[{partition}] {first}-{last} not written: "
                    f"{seg.path.name} already holds offsets {seg.first}-{seg.last} (another "
                    "writer of this lane; nothing was overwritten)"
                )

    def _dead_letters(
        self, raw: pa.Table, decoded: pa.Table, failures: Sequence[DecodeFailure] | None
    ) -> pa.Table | None:
        """The raw rows whose payload did not decode, with reason, error, stage and time."""
        if failures is None:
            failures = self._failures_of(decoded)
        if not failures:
            return None
        ordered = sorted(failures, key=lambda f: f.row)
        dead = raw.take(pa.array([f.row for f in ordered], pa.int64()))
        if self._columns.payload in dead.column_names:
            dead = row_bytes(dead, self._columns)
        reasons = [f.reason.value for f in ordered]
        messages = [f.message for f in ordered]
        stages = [f.reason.stage for f in ordered]
        c = self._columns
        n = dead.num_rows
        now = time.time_ns() // 1000
        extra = {
            c.stamped("dlq_reason"): pa.array(reasons, pa.string()),
            c.stamped("dlq_error"): pa.array(messages, pa.string()),
            c.stamped("dlq_stage"): pa.array(stages, pa.string()),
            c.stamped("dlq_ts"): pa.array([now] * n, pa.int64()).cast(
                c.dlq_schema.field(c.stamped("dlq_ts")).type
            ),
        }
        for name, arr in extra.items():
            dead = dead.append_column(name, arr)
        return dead.select(c.dlq_schema.names).cast(c.dlq_schema)

    def _failures_of(self, decoded: pa.Table) -> list[DecodeFailure]:
        """Failures read back from a decoded table's error column (``reason: message``),
        for tables that did not come through the decode stage."""
        if self._columns.decode_error not in decoded.column_names:
            return []
        errors = decoded.column(self._columns.decode_error)
        if errors.null_count == len(errors):
            return []
        rows = pc.indices_nonzero(pc.is_valid(errors)).to_pylist()
        out = []
        for row, text in zip(rows, errors.take(rows).to_pylist(), strict=True):
            reason, _, message = text.partition(":")
            out.append(DecodeFailure(row, _reason(reason), message.strip() or text))
        return out

    def _make_room(self, exc: BaseException) -> None:
        """A write refused for want of space: drop the read cache's IPC copies first (a
        cache never holds space the lanes need; the retry may then fit)."""
        full = (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "[errno 28]" in str(exc)
        if full and self._cache is not None and self._cache.copies is not None:
            self._cache.copies.clear()

    def _keep(self, path: Path, table: pa.Table, *, copy: bool = False) -> None:
        """Hand a durable segment's table to the read cache as a reader of the file would
        get it: Parquet changes some types on the way (seconds become milliseconds, list
        items are renamed), so the table is cast to the file's own Arrow schema — read
        from the footer just written, a zero-copy cast where nothing differs."""
        if self._cache is None or not self._cache.enabled:
            return
        try:
            schema = pq.read_schema(path).remove_metadata()
            self._cache.put(path, table.replace_schema_metadata(None).cast(schema), copy=copy)
        except (OSError, pa.ArrowException) as exc:  # only a cache: the read path decodes
            log.debug("segment %s not cached: %s", path, exc)

    def _publish_decoded(
        self, encoding: Future[Path], path: Path, decoded: pa.Table, fence: Fence, required: bool
    ) -> bool:
        """Rename the decoded segment; False when it could not be written and the raw
        lane can rebuild it (it is ``required`` for file rows, whose fields it holds)."""
        try:
            self._publish(encoding.result(), path, fence)
            self._keep(path, decoded, copy=True)
            return True
        except (OSError, pa.ArrowException) as exc:
            self._make_room(exc)
            if required:
                raise _not_written("decoded", path, exc) from exc
            # The raw lane is primary: a decoded-lane failure never blocks it. The
            # missing decoded segment is rebuilt from raw while the gateway runs
            # (engine/ingest/rebuilds.py) and at the next start.
            log.error("decoded segment %s not written: %s", path, exc)
            return False

    def _write_dead(
        self, dead: pa.Table, path: Path, meta: dict[bytes, bytes], fence: Fence
    ) -> None:
        """Durable before the raw segment, so before the commit: a failed record is
        findable in the dead-letter lane by the time its offset is committed."""
        try:
            self._durable(dead, path, {**meta, META_LANE: b"dlq"}, stats=True, fence=fence)
        except (OSError, pa.ArrowException) as exc:
            raise _not_written("dead-letter", path, exc) from exc

    def _encodings(self, table: pa.Table) -> tuple[list[str], dict[str, str]]:
        """Which columns get a dictionary, and the encoding of the sequential ones.

        A dictionary where values repeat: the low-cardinality metadata, ingest times,
        a source timestamp that is one value for the segment, and payload strings
        (Parquet falls back by itself where they turn out unique); none for record ids,
        offsets, numbers and times, where building one only to drop it costs more than
        the rest of the write (measured in docs/performance.md, "twg batch"). Offsets
        and positions ascend and record ids share prefixes: delta-encoded, they take
        almost nothing (a 400k-row segment's ids: 13 KB instead of 410 KB).
        """
        c = self._columns
        names = table.column_names
        dictionary = [n for n in self._dictionary if n in names]
        dictionary += [
            f.name
            for f in table.schema
            if not c.is_reserved(f.name)
            and (pa.types.is_string(f.type) or pa.types.is_large_string(f.type))
        ]
        # Ingest times repeat per fetched batch; a source timestamp that is one value
        # for the segment (a file's modification time) too. A dictionary of them is a
        # third of a plain write's cost (measured: 5.7 against 17 ms per 400k rows); a
        # constant string is not hashed faster than it is written, so it stays plain.
        if c.stamped("ingest_ts") in names:
            dictionary.append(c.stamped("ingest_ts"))
        ts = c.timestamp
        if ts in names and table.num_rows:
            col = table.column(ts)
            if col[0] == col[-1]:
                dictionary.append(ts)
        encoding = {
            n: "DELTA_BINARY_PACKED"
            for n in (c.offset, c.position)
            if n in names and pa.types.is_int64(table.schema.field(n).type)
        }
        if c.record_id in names:  # ids of a partition share their first 8 to 15 bytes
            encoding[c.record_id] = "DELTA_BYTE_ARRAY"
        return dictionary, encoding

    def _durable(
        self,
        table: pa.Table,
        path: Path,
        meta: dict[bytes, bytes],
        *,
        stats: bool,
        codec: str | None = None,
        fence: Callable[[], object] = _no_fence,
        exclusive: bool = False,
    ) -> int:
        tmp = self._prepare(table, path, meta, stats=stats, codec=codec)
        return self._publish(tmp, path, fence, exclusive=exclusive)

    def _prepare(
        self,
        table: pa.Table,
        path: Path,
        meta: dict[bytes, bytes],
        *,
        stats: bool,
        codec: str | None = None,
    ) -> Path:
        """``table`` written and fsynced under a temp name beside ``path``.

        ``stats``: statistics for the position, timestamp and partition only (raw and
        dead-letter lanes); otherwise for every column but the record and message ids
        (the decoded lane: a query's filters on its fields prune row groups).
        """
        schema_meta = dict(table.schema.metadata or {})
        schema_meta.update(meta)
        chosen = codec or self._cfg.compression
        compression = None if chosen == "none" else chosen
        level = self._cfg.compression_level if compression in ("zstd", "gzip") else None
        columns = set(table.column_names)
        dictionary, encoding = self._encodings(table)

        def write(tmp: Path) -> None:
            pq.write_table(
                table.replace_schema_metadata(schema_meta),
                tmp,
                compression=compression,
                compression_level=level,
                row_group_size=_ROW_GROUP,
                use_dictionary=dictionary,
                column_encoding=encoding,
                write_statistics=[c for c in self._stats if c in columns]
                if stats
                else [c for c in table.column_names if c not in self._no_stats],
            )

        return prepare(path, write, fsync=self._cfg.fsync)

    def _publish(
        self, tmp: Path, path: Path, fence: Callable[[], object], *, exclusive: bool = False
    ) -> int:
        """Rename a prepared temp file to ``path`` once ``fence`` allows; its size."""
        try:
            publish(tmp, path, exclusive=exclusive, fsync=self._cfg.fsync, check=fence)
        except FileExistsError as exc:
            # link() refuses an existing name, atomically: never an overwritten segment.
            raise SegmentConflictError(
                f"segment {path} already exists; it is never overwritten"
            ) from exc
        return path.stat().st_size


def _not_written(lane: str, path: Path, exc: BaseException) -> LaneError:
    """The error for a segment not written: retriable (a full disk, a lost mount) unless
    Parquet has no mapping for a type in it — that table fails every time."""
    message = f"{lane} segment {path} not written: {exc}"
    if isinstance(exc, pa.ArrowNotImplementedError):
        return UnwritableSegmentError(message)
    return LaneError(message)
