"""Checkpoint policy: where each level writes, how often, how many files it keeps."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LevelConfig(BaseModel):
    """One checkpoint level (a directory and a cadence).

    A level is due when `every_iterations` iterations or `every_seconds` seconds have passed
    since its last snapshot (whichever comes first); with neither set it is written only by
    explicit `save()` calls and the final save.
    """

    model_config = ConfigDict(extra="forbid")

    dir: Path
    every_iterations: int | None = Field(default=None, ge=1)
    every_seconds: float | None = Field(default=None, gt=0)
    keep: int = Field(default=3, ge=1, description="checkpoint files kept in this directory")


class CheckpointPolicy(BaseModel):
    """L1 is node-local and frequent (may be off); L2 is the run's shared output, less often."""

    model_config = ConfigDict(extra="forbid")

    l1: LevelConfig | None = None
    l2: LevelConfig | None = None
    max_overhead: float | None = Field(
        default=0.04, gt=0, le=1,
        description="CPU the writers of a level may use, as a fraction of elapsed time: a "
        "level due sooner than that allows stays due until it does (then the freshest "
        "state is saved). None: no limit.")

    @model_validator(mode="after")
    def _distinct_dirs(self) -> CheckpointPolicy:
        if (self.l1 is not None and self.l2 is not None
                and Path(self.l1.dir).resolve() == Path(self.l2.dir).resolve()):
            raise ValueError(f"L1 and L2 checkpoint levels share one directory: {self.l1.dir}")
        return self

    def levels(self) -> dict[str, LevelConfig]:
        """Enabled levels by name, L1 first."""
        out: dict[str, LevelConfig] = {}
        if self.l1 is not None:
            out["L1"] = self.l1
        if self.l2 is not None:
            out["L2"] = self.l2
        return out

    def dirs(self) -> list[Path]:
        return [Path(c.dir) for c in self.levels().values()]
