"""What the head loop asks about a job's identity when it launches it (implemented by
`auth.control.AccessControl`): extra environment (the job's own token) and the Unix account."""

from __future__ import annotations

from typing import Protocol

from gpucluster.store import JobRecord


class JobIdentity(Protocol):
    def job_env(self, job: JobRecord) -> dict[str, str]:
        """Variables the job's processes get: GPUCLUSTER_JOB_TOKEN, for its progress reports."""

    def run_as(self, owner: str | None) -> str | None:
        """The Unix account to run a job of `owner` as; None: the head's own."""
