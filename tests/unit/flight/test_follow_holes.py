"""A follow stream never steps over positions its gateway's lane does not hold.

The case from the soak (docs/status.md, session 20): a member paused past its session
returns to the *same* partition; meanwhile another member ingested it and committed,
so the returning member's tail restarts at that commit while a follow stream at it
still stands where the pause found it. The durable end then says "written up to the
commit", but the positions between are another member's: the stream must wait for
them to arrive (an object store's restore, a replica's sync) or end saying so — before
the fix it moved its cursor to the commit and went on, jumping what the other member
ingested.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import thalweg.flight.read.stream as stream_mod
from tests.unit.lane.test_lane import COLS, raw, writer
from thalweg.flight.read.plan import plan_read
from thalweg.flight.read.stream import HistoryGapError, read_stream
from thalweg.flight.read.tickets import parse_ticket
from thalweg.lane.read.catalog import LaneCatalog
from thalweg.lane.read.elsewhere import record_elsewhere
from thalweg.lane.read.live import LiveEntry, LiveTail
from thalweg.lane.writer import SegmentWriter

OFF = COLS.position


def _entry(first: int, last: int) -> LiveEntry:
    batch = raw(list(range(first, last + 1))).to_batches()[0]
    return LiveEntry(first, last, batch, None)


def _offsets(batches: Iterator[pa.RecordBatch], n: int) -> list[int]:
    """The next ``n`` offsets the stream sends."""
    got: list[int] = []
    while len(got) < n:
        got.extend(next(batches).column(OFF).to_pylist())
    return got


def _following(tmp_path: Path) -> tuple[LaneCatalog, LiveTail, SegmentWriter, Iterator]:
    """A lane holding 0-9, this gateway's tail at 10, a raw follow stream of partition 0
    that has sent 0-9."""
    layout, w = writer(tmp_path)
    w.write("t", 0, raw(list(range(10))), None, 0, 10)
    live = LiveTail()
    live.reset("t", 0, 10)
    catalog = LaneCatalog(layout, COLS, live)
    ticket = parse_ticket(
        b'{"topic": "t", "lane": "raw", "partitions": [0], "start": {"offset": 0}, "end": "follow"}'
    )
    batches = read_stream(catalog, plan_read(catalog, ticket), lambda: False)
    assert _offsets(batches, 10) == list(range(10))
    return catalog, live, w, batches


def _return_at(live: LiveTail, commit: int) -> None:
    """The member gets the partition back at another member's ``commit`` and fetches."""
    live.forget("t", 0)
    live.reset("t", 0, commit)
    live.append("t", 0, _entry(commit, commit + 9))


def test_positions_another_replica_holds_end_the_stream_instead_of_a_jump(
    tmp_path: Path,
) -> None:
    catalog, live, _w, batches = _following(tmp_path)
    record_elsewhere(catalog.layout, "t", 0, 10, 50)  # as a resume at the commit does
    _return_at(live, 50)
    with pytest.raises(HistoryGapError, match=r"offsets 10-49 .*another replica.*\{0: 10\}"):
        next(batches)


@pytest.mark.timeout(60)  # unfixed, the stream jumps to 50, then waits forever
def test_the_stream_waits_for_the_hole_to_fill_and_sends_every_offset_once(
    tmp_path: Path,
) -> None:
    _catalog, live, w, batches = _following(tmp_path)
    _return_at(live, 50)

    def restore() -> None:  # the other member's segment arrives (a restore, a sync)
        time.sleep(0.6)
        w.write("t", 0, raw(list(range(10, 50))), None, 10, 50)

    filler = threading.Thread(target=restore)
    filler.start()
    try:
        assert _offsets(batches, 50) == list(range(10, 60))
    finally:
        filler.join()


def test_a_hole_that_never_fills_ends_the_stream_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_mod, "_GAP_WAIT_S", 0.5)
    _catalog, live, _w, batches = _following(tmp_path)
    _return_at(live, 50)
    with pytest.raises(HistoryGapError, match=r"offsets 10-49 .*did not arrive"):
        next(batches)


def test_a_live_entry_past_the_reader_is_not_taken_without_its_history() -> None:
    live = LiveTail()
    live.reset("t", 0, None)  # a rewind to nowhere known: the tail starts with the fetch
    live.append("t", 0, _entry(50, 59))
    assert live.entries_from("t", 0, 10) == []
    assert [e.first for e in live.entries_from("t", 0, 50)] == [50]


def test_offsets_the_broker_skipped_still_continue_the_tail() -> None:
    live = LiveTail()
    live.reset("t", 0, 10)
    live.append("t", 0, _entry(12, 19))  # 10-11: transaction markers
    live.append("t", 0, _entry(30, 39))  # 20-29: compacted away
    got = live.entries_from("t", 0, 10)
    assert [(e.covers_from, e.first) for e in got] == [(10, 12), (20, 30)]
    assert [e.first for e in live.entries_from("t", 0, 25)] == [30]
