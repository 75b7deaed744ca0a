"""What the parts of one source's engine share.

A source's engine is four parts — the fetch loop (``runner``), the partitions it holds
and where they stand (``partitions``), the way to durable and committed
(``checkpoint``), and the broker watch (``watch``) — over one :class:`SourceState`.
The state is plain data; each part owns the decisions of its own idea.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from thalweg.config.models import (
    ArrowIpcSourceConfig,
    FilesSourceConfig,
    FlightSourceConfig,
    KafkaSourceConfig,
    PulsarSourceConfig,
    RawLaneConfig,
)
from thalweg.engine.ingest.buffer import PartitionBuffer
from thalweg.engine.ingest.fence import OwnershipFence
from thalweg.engine.ingest.lag_gate import LagGate
from thalweg.group.owners import OwnerDirectory
from thalweg.lane.epochs import Divergence
from thalweg.lane.layout import LaneLayout
from thalweg.lane.read.live import LiveTail
from thalweg.lane.remote.mirror import LaneMirror
from thalweg.lane.writer import SegmentWriter
from thalweg.ops.health import Health
from thalweg.ops.metrics import Metrics
from thalweg.ops.retry import Backoff
from thalweg.ops.stats import PipelineStats
from thalweg.ops.tracing import Tracing
from thalweg.records.columns import MetadataColumns
from thalweg.sources.base import PartitionKey, Source, SourceFeatures

RAW_LANE = "raw_lane"  # the health component of the primary raw lane
RETRY_BASE_S = 0.2
RETRY_MAX_S = 5.0
#: The first wait after a broker refused a login (it grows to ``login_retry_max_s``).
LOGIN_RETRY_BASE_S = 5.0

SourceConfig = (
    KafkaSourceConfig
    | PulsarSourceConfig
    | FilesSourceConfig
    | ArrowIpcSourceConfig
    | FlightSourceConfig
)


@dataclass(frozen=True, slots=True)
class LaneContext:
    """The gateway-wide parts every source writes through."""

    layout: LaneLayout
    writer: SegmentWriter
    columns: MetadataColumns
    live: LiveTail
    metrics: Metrics
    health: Health
    raw_cfg: RawLaneConfig
    stats: PipelineStats = field(default_factory=PipelineStats)
    tracing: Tracing = field(default_factory=lambda: Tracing(None))
    # Backpressure through the DAG (recovery.max_lag_records), when configured.
    gate: LagGate | None = None
    # The group's partition owners (group/owners.py), published by the Kafka assignor.
    owners: OwnerDirectory = field(default_factory=OwnerDirectory)
    # Lanes in an object store (lane/remote/mirror.py): segments are durable once PUT there.
    mirror: LaneMirror | None = None
    # Records set aside by decoding, per (topic, reason code): what a run reports.
    dead_letters: Counter[tuple[str, str]] = field(default_factory=Counter)


@dataclass(slots=True)
class SourceState:
    """One source's live state: its client, its partitions' buffers, the partitions
    held because their log diverged, and whether it must stop.

    Attributes:
        fatal: set when a batch was lost from memory without being durable; the loop
            re-raises it and nothing is written or committed after it.
        paused: fetching is paused by backpressure.
    """

    cfg: SourceConfig
    ctx: LaneContext
    source: Source
    fence: OwnershipFence | None
    component: str
    features: SourceFeatures = field(default_factory=SourceFeatures)
    parts: dict[PartitionKey, PartitionBuffer] = field(default_factory=dict)
    held: dict[PartitionKey, Divergence] = field(default_factory=dict)
    fatal: BaseException | None = None
    paused: bool = False
    broker_down: bool = False

    def labels(self, key: PartitionKey) -> tuple[str, str, str]:
        return (self.cfg.name, key[0], str(key[1]))

    @property
    def in_doubt(self) -> bool:
        """Ownership of the partitions is in doubt (nothing may be renamed or committed)."""
        return self.fence is not None and self.fence.in_doubt


def new_backoff() -> Backoff:
    return Backoff(RETRY_BASE_S, RETRY_MAX_S)
