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

    def log(self, job_id: int, attempt: int) -> Path:
        return self.attempt_dir(job_id, attempt) / "output.log"
