"""Where the head keeps its files inside the data dir, and who may read them.

DATA/            0711 root: passable, not listable (a job reaches its own directory below)
  state.db       0600: every team's jobs and secrets, token digests, the job-token key
  head.lock      0600
  run/           0700: the head's own records of each attempt (spec.json with the command and its
                 environment, shim.json, exit.json): no job can read or forge them
  jobs/          0711
    <id>/        0700, the submitter's: its logs (attempt-N/[rank-R/]output.log) and checkpoints,
                 made by the job's own processes; teammates read them through the API only
"""

from __future__ import annotations

import os
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

    def secure(self) -> None:
        """Make the data dir and its state private to the head (see the module docstring)."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)
        for private, mode in ((self.root / "run", 0o700), (self.root / "jobs", 0o711)):
            private.mkdir(mode=mode, exist_ok=True)
            os.chmod(private, mode)
        for state in (self.db, self.lock, *self.root.glob("state.db-*")):
            if state.exists():
                os.chmod(state, 0o600)

    def unreachable_by_jobs(self) -> Path | None:
        """A directory above the data dir that other accounts cannot pass through, if any: there a
        job run as its submitter could not reach its own directory (its log, its checkpoints)."""
        for d in (self.root, *self.root.parents):
            if not os.stat(d).st_mode & 0o001:
                return d
        return None

    def job_dir(self, job_id: int) -> Path:
        """The job's own directory: its logs and checkpoints, owned by the account it runs as."""
        return self.root / "jobs" / str(job_id)

    def attempt_dir(self, job_id: int, attempt: int) -> Path:
        """Where an attempt's logs are (inside the job's own directory)."""
        return self.job_dir(job_id) / f"attempt-{attempt}"

    def run_dir(self, job_id: int, attempt: int) -> Path:
        """The head's own records of an attempt: what the executor started and how it ended."""
        return self.root / "run" / str(job_id) / f"attempt-{attempt}"

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
        return self.job_dir(job_id) / "checkpoints"
