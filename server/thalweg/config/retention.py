"""``[retention]`` and ``[compaction]``: how much of each partition's lanes a gateway
keeps, and in how many files (docs/lanes.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RetentionConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_age_s: float | None = Field(
        None,
        gt=0,
        description="Remove a partition's segments (every lane) older than this; none: keep.",
    )
    max_bytes: int | None = Field(
        None,
        gt=0,
        description="Remove a partition's oldest segments while its lanes hold more than "
        "this many bytes on disk; none: no bound.",
    )
    wait_for_sinks: bool = Field(
        True,
        description="Never remove what a sink or node lane has not landed yet (the sink's "
        "lag holds retention back, visibly); false: remove on schedule, the sink skips it.",
    )
    grace_s: float = Field(
        60.0,
        ge=0,
        description="Files below the retention floor are deleted this long after it rose, "
        "so a read planned before keeps its files.",
    )
    interval_s: float = Field(30.0, gt=0, description="How often retention runs.")

    @property
    def enabled(self) -> bool:
        return self.max_age_s is not None or self.max_bytes is not None


class CompactionConfig(BaseModel):
    """``[compaction]``: small segments merged into larger files (docs/lanes.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(
        False, description="Merge a partition's small closed segments into target-size files."
    )
    target_bytes: int = Field(
        128 << 20, gt=0, description="A merged file's size ceiling (its segments' bytes)."
    )
    min_files: int = Field(4, ge=2, description="Merge only runs of at least this many files.")
    min_age_s: float = Field(
        60.0, ge=0, description="Leave segments younger than this alone (the live tail's)."
    )
    grace_s: float = Field(
        60.0,
        ge=0,
        description="The merged files are deleted this long after the merge, so a read "
        "that listed them keeps them.",
    )
    interval_s: float = Field(30.0, gt=0, description="How often compaction runs.")
