"""Which job a GPU process belongs to: NVML gives pids, the executor's handles give process groups.

First by cgroup: where the node has them, every process of a job is in the job's cgroup
(`.../gpucluster/<head>/job-<id>-attempt-<n>[-rank-<r>]`, executors/cgroups.py), which no process
can leave, so that answer cannot be forged. Else by tree: every job process runs under a shim that
leads its own session and process group (the handle's `pgid`, one per rank for a distributed
job), and a pid belongs to a job when it, or one of its ancestors, is in one of the job's groups or
sessions: that also covers workers a launcher (torchrun) started in sessions of their own. Last, a
process in no job's cgroup and orphaned out of its tree is found by the `GPUCLUSTER_JOB_ID` in its
environment, which its user could set: only on nodes without cgroups does that fallback matter.

Known limit: NVML reports pids as the host sees them; a head in a different pid namespace than
its jobs (a container) cannot attribute them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpucluster.executors.cgroups import job_in

MAX_DEPTH = 32


def job_groups(running: Iterable[tuple[int, Mapping[str, Any] | None]]) -> dict[int, int]:
    """pgid -> job id, from the (job id, launch handle) of each running job."""
    out: dict[int, int] = {}
    for job_id, handle in running:
        if not handle:
            continue
        for part in handle.get("ranks", [handle]):
            pgid = part.get("pgid")
            if pgid is not None:
                out[int(pgid)] = job_id
    return out


class PidResolver:
    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root

    def _stat(self, pid: int) -> tuple[int, int, int] | None:
        """(ppid, pgrp, session) of a live process."""
        try:
            with open(f"{self.proc_root}/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return int(fields[1]), int(fields[2]), int(fields[3])
        except (OSError, IndexError, ValueError):
            return None

    def _env_job(self, pid: int) -> int | None:
        try:
            with open(f"{self.proc_root}/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            return None
        for item in env.split(b"\0"):
            if item.startswith(b"GPUCLUSTER_JOB_ID="):
                try:
                    return int(item.split(b"=", 1)[1])
                except ValueError:
                    return None
        return None

    def _cgroup_job(self, pid: int) -> int | None:
        """The job whose cgroup holds `pid` (any hierarchy), if any."""
        try:
            with open(f"{self.proc_root}/{pid}/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        for line in lines:
            job = job_in(line.split(":", 2)[-1])
            if job is not None:
                return job
        return None

    def job_of(self, pid: int, groups: Mapping[int, int]) -> int | None:
        in_cgroup = self._cgroup_job(pid)
        if in_cgroup is not None:
            return in_cgroup if in_cgroup in groups.values() else None
        p = pid
        for _ in range(MAX_DEPTH):
            st = self._stat(p)
            if st is None:
                break
            ppid, pgrp, sid = st
            for g in (pgrp, sid):
                if g in groups:
                    return groups[g]
            if ppid <= 1:
                break
            p = ppid
        job = self._env_job(pid)
        return job if job is not None and job in groups.values() else None

    def resolve(self, pids: Iterable[int], groups: Mapping[int, int]) -> dict[int, int]:
        """pid -> job id for the pids that belong to a running job."""
        out = {}
        for pid in pids:
            job = self.job_of(pid, groups)
            if job is not None:
                out[pid] = job
        return out
