"""What a destination declares and answers beside its writes (``Sink``, ``base.py``).

``Capabilities``: what a kind supports, read by the contract suite to run or skip (by
name) each case. ``Held``: what a destination holds, read back from it — the one way
``twg verify`` and ``twg recover`` learn a destination's coverage and rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

# (topic, partition, epoch) -> half-open position ranges, as ``base.Ranges``.
Ranges = dict[tuple[str, int, int], list[tuple[int, int]]]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a kind of destination supports, declared beside its code: the contract
    suite (``tests/integration/test_destination_contract.py``) runs each case a kind
    declares and skips the others naming the field, never silently."""

    upsert: bool  # ``mode = "upsert"``: one row per key, the fold of the topic
    routing: bool  # a table or path template naming record fields ("{tenant}_orders")
    refuses_values: bool  # some values can never go in (``on_refused`` is exercised)
    reads_back: bool  # its rows and its own coverage record can be read back (verify)
    rebuilds_dropped: bool  # a dropped unrouted table or file is rebuilt by the next pass
    # The feeder notices rows deleted behind it from an unrouted table still there, and
    # feeds them again (recovery/recheck.py); needs ``reads_back``.
    detects_deleted_rows: bool = False
    # A live table's schema: an added column evolves it; a changed column stops the
    # sink (degraded, the column and both types named) until the table is changed, and
    # it resumes from its coverage (sinks/schema_change.py, docs/sinks.md).
    evolves_schema: bool = False
    # int → long and float → double evolve the table too (without: they stop it).
    widens_types: bool = False
    # Its tables say what the topic's contract says of them: a description, column
    # comments, properties and tags (sinks/table_docs.py, ADR 0042).
    describes_tables: bool = False


@dataclass(frozen=True, slots=True)
class Held:
    """What a destination holds, read back from the destination itself (``twg verify``
    and ``twg recover`` ask this, never a copy of the destination's layout).

    ``coverage``: its own record of coverage (None: it keeps none, the coverage store is
    the only record). ``rows``: per configured topic, the locator columns of its rows
    (None: no table for that topic).
    """

    coverage: Ranges | None
    rows: dict[str, pa.Table | None]
