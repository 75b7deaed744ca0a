"""A partition's origin record in the object store, beside its segments.

``lane/origin.py`` notes where a partition's lane began, so that ``twg verify`` finds a
lost *first* segment. With the lanes in a bucket the local record lives in a cache
(``object_store.cache_dir``) that a new host, a wiped cache or ``twg verify``'s own copy
never sees; without it a bucket lane begun at ``auto_offset_reset = "latest"`` or at a
group commit could lose its first object unseen. So the bucket keeps it too::

    <prefix>/origins/topic=<t>/<partition>.json      {"position": N}

The owner PUTs it once (``If-None-Match``) before the partition's first raw object it
publishes in a process — so a raw object in the bucket has its lane's origin there — and
every restore or sync fetches it where the local lane has none. A record already there
with another position stays while the bucket holds raw objects of the partition (a lane
begun again after retention swept all of it: the earlier beginning). With none, it is
the record of a lane that never got an object (killed between the record's PUT and the
first object's) and the local one replaces it: a lane begun later at ``latest`` would
otherwise be named as missing its start.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

from thalweg.errors import SegmentConflictError
from thalweg.lane.durable import write_file_durably
from thalweg.lane.layout import Lane, LaneLayout
from thalweg.lane.origin import ORIGIN
from thalweg.lane.remote.objectstore import ObjectStore

log = logging.getLogger(__name__)


def origin_rel(topic: str, partition: int) -> str:
    """The record's name in the store."""
    return f"origins/topic={quote(topic, safe='')}/{partition}.json"


def publish_origin(
    store: ObjectStore, layout: LaneLayout, topic: str, partition: int, raw_prefix: str
) -> bool:
    """PUT the partition's local origin record, created once (``raw_prefix``: where the
    bucket keeps the partition's raw objects); True when the bucket now has one, False
    when there is none locally to put.

    Raises:
        LaneError: the store did not take it (retriable: the segment's PUT waits).
    """
    path = layout.partition_dir(Lane.RAW, topic, partition) / ORIGIN
    if not path.exists():
        return False
    try:
        store.put_new(origin_rel(topic, partition), path)
    except SegmentConflictError:
        if store.listing(raw_prefix):
            log.info("%s[%d]: the bucket's origin record is an earlier one; kept", topic, partition)
        else:  # a record of a lane that never got an object: this lane's replaces it
            store.put(origin_rel(topic, partition), path.read_bytes())
    return True


def fetch_origin(store: ObjectStore, layout: LaneLayout, topic: str, partition: int) -> bool:
    """Take the bucket's origin record where the local lane has none; True if fetched."""
    path = layout.partition_dir(Lane.RAW, topic, partition) / ORIGIN
    if path.exists():
        return False
    body = store.read(origin_rel(topic, partition))
    if body is None:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file_durably(path, lambda tmp: tmp.write_bytes(body))
    return True
