"""One topic into many Arrow IPC directories (``path = "out/{tenant}"``, docs/cdc.md).

The files of one flushed range go to the directories their rows name, each file named
by the range as an unrouted sink names it; the range then gets an empty file of the
same name in the **control directory** (``_thalweg_coverage`` beside the routed
directories, below the template's fixed part) — the sink's coverage, read on open and
by ``twg verify``. A flush cut between the two is replayed; a directory that already
holds the range's rows (a file whose name covers their positions) leaves them out
(``routes.not_held``). The same two steps as the routed Iceberg sink (ADR 0036).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from thalweg.records.ranges import merge_ranges
from thalweg.sinks.routes import FIELD, RESERVED

CONTROL = RESERVED  # the control directory: a name no route may take
FILE = re.compile(r"^e(\d{6})-(\d{20})-(\d{20})\.(arrow|parquet)$")


def _split(template: str) -> tuple[str, str]:
    """``template`` as its fixed directory (text up to the last separator before the
    first field) and the rest."""
    fixed = template[: template.index("{")]
    cut = fixed.rfind(os.sep) + 1
    return template[:cut], template[cut:]


def base(template: str) -> Path:
    """The directory above every directory ``template`` can name."""
    return Path(_split(template)[0] or ".")


def control_dir(template: str) -> Path:
    """Where a routed sink's coverage is kept."""
    return base(template) / CONTROL


def dirs_of(template: str) -> list[str]:
    """The directories ``template`` names that exist now (never the control one)."""
    root = base(template)
    pattern = FIELD.sub("*", _split(template)[1])
    if not root.is_dir():
        return []
    found = (p for p in root.glob(pattern) if p.is_dir())
    return sorted(str(p) for p in found if CONTROL not in p.relative_to(root).parts)


def held(pdir: Path, epoch: int, suffix: str) -> list[tuple[int, int]]:
    """The ranges the files of one partition directory cover, for ``epoch``."""
    if not pdir.is_dir():
        return []
    out = []
    for name in os.listdir(pdir):
        m = FILE.match(name)
        if m and name.endswith(suffix) and int(m[1]) == epoch:
            out.append((int(m[2]), int(m[3])))
    return merge_ranges(out)
