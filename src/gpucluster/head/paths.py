"""Where the head keeps its files inside the data dir."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DataDir:
    root: Path

    @property
    def db(self) -> Path:
        return self.root / "state.db"

    @property
    def lock(self) -> Path:
        return self.root / "head.lock"

    def attempt_dir(self, job_id: int, attempt: int) -> Path:
        return self.root / "jobs" / str(job_id) / f"attempt-{attempt}"

    def log(self, job_id: int, attempt: int, rank: int | None = None) -> Path:
        """An attempt's log; with `rank`, that process's log of a multi-process attempt."""
        if rank is None:
            return self.attempt_dir(job_id, attempt) / "output.log"
        return self.rank_dir(job_id, attempt, rank) / "output.log"

    def rank_dir(self, job_id: int, attempt: int, rank: int) -> Path:
        """One process of a multi-process attempt: a rank (per-GPU), or a node's launcher."""
        return self.attempt_dir(job_id, attempt) / f"rank-{rank}"

    def checkpoints(self, job_id: int) -> Path:
        """The job's checkpoint directory, the same for every attempt (GPUCLUSTER_CHECKPOINT_DIR)."""
        return self.root / "jobs" / str(job_id) / "checkpoints"
