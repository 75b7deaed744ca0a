"""A sink's dead-letter lane in the object store, beside the lanes it refused from.

``recovery.refused`` writes the records a destination refused for good into
``data_dir/refused/<sink>/dlq/…`` of the gateway that feeds the sink. With the lanes in a
bucket that ``data_dir`` is a cache (``object_store.cache_dir``) another host may never
see: the bucket keeps the refused lane too, under the same relative names::

    <prefix>/refused/<sink>/dlq/topic=<t>/partition=<p>/<first:020d>-<last:020d>.parquet

The feeder PUTs each file after writing it and before the sink's coverage moves over its
records, so a covered refused record is in the bucket; it also fetches what the bucket
holds when it opens (a new host, a wiped cache), before it rechecks its rows. ``twg
verify`` fetches them (never PUTs: it writes nothing) into the copy it audits.

Files are named by the positions they hold and written once (``If-None-Match``); the
feeder is the one writer of a sink's lane. A local file whose name the bucket holds with
other bytes — refused again, at another time, after a cache lost before the fetch — is
left as it is: the bucket's copy names the same positions.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from thalweg.errors import SegmentConflictError
from thalweg.lane.durable import TMP_MARK
from thalweg.lane.layout import REFUSED_DIR, LaneLayout
from thalweg.lane.remote.objectstore import ObjectStore


def refused_prefix(sink: str) -> str:
    """The relative key prefix of sink ``sink``'s dead-letter lane in the store."""
    return f"{REFUSED_DIR}/{quote(sink, safe='')}/"


def sync_refused(
    layout: LaneLayout, store: ObjectStore, sink: str, *, put: bool
) -> tuple[int, int]:
    """Make sink ``sink``'s dead-letter lane the same here and in ``store``: fetch the
    objects the local lane lacks, and with ``put`` PUT the local files the store lacks.
    (put, fetched).

    Raises:
        LaneError: the store did not answer or take a file (retriable: call again).
    """
    root = layout.refused(sink).root
    prefix = refused_prefix(sink)
    held = store.listing(prefix)
    local = _local_files(root)
    sent = 0
    if put:
        for rel in sorted(set(local) - {k[len(prefix) :] for k in held}):
            try:
                store.put_new(prefix + rel, root / rel)
            except SegmentConflictError:
                continue  # the same positions, refused at another time: the store's stand
            sent += 1
    fetched = 0
    for key in sorted(held):
        rel = key[len(prefix) :]
        if rel.endswith(".parquet") and rel not in local:
            fetched += store.get(key, root / rel)
    return sent, fetched


def _local_files(root: Path) -> set[str]:
    """The final files of a local dead-letter lane, relative to its root."""
    out: set[str] = set()
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith(".parquet") and TMP_MARK not in name:
                out.add(str((Path(directory) / name).relative_to(root)))
    return out
