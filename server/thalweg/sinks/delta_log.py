"""What a Delta table's commits record for a sink (ADR 0040): its coverage, and for a
routed sink's control table the names of its tables, each in the ``commitInfo`` of the
commit that landed them. Read back from the newest commit that has the key: an
``OPTIMIZE`` or ``VACUUM`` commit in between carries none."""

from __future__ import annotations

import json
from typing import Any

from thalweg.sinks.base import Ranges
from thalweg.sinks.coverage_json import COVERAGE_PREFIX, decode_coverage

TABLES_PREFIX = "thalweg.tables."  # a routed sink's control table: its tables' names
_HISTORY = 100  # commits read back at a time


def newest(table: Any, key: str) -> str | None:
    """The newest commit's ``key`` (None: no commit has it)."""
    limit = _HISTORY
    while True:
        history = table.history(limit=limit)
        for commit in history:  # newest first
            text = commit.get(key)
            if isinstance(text, str):
                return text
        if len(history) < limit:
            return None
        limit *= 10


def coverage(table: Any, sink: str) -> Ranges:
    """``sink``'s coverage of ``table``."""
    text = newest(table, COVERAGE_PREFIX + sink)
    return decode_coverage(text) if text is not None else {}


def tables(control: Any, sink: str) -> set[str]:
    """The tables a routed ``sink``'s control table names."""
    text = newest(control, TABLES_PREFIX + sink)
    return set(json.loads(text)) if text is not None else set()
