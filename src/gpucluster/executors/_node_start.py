"""The node side of one job process's start, before its keeper runs: the job's directory, the
run dir, the cgroup with its limits and GPU fence, and the shim's spec file.

Why a module of its own: the node's fork server (`_shim.py --serve`) does this for every start
it is asked for (issue 18: 1.5 ms of the head's CPU per job was this file and cgroup work, in the
head's process, where a cluster's head should do none of a node's work: Slurm's slurmctld does
none either); the executor does it itself only where no server runs (local.py `prepare_here`).
One code for both. Standard library only (and gpucluster.errors where the package is
importable): the server runs as ``python -I -S`` and loads this file, and cgroups.py and
atomicfile.py, by path; the executor hands the same modules in (`prepare`'s `cgroups` and
`write_json`).

Every step may be done again for the same start (a server that died before it answered: the
executor asks a new one, or does it itself): a job directory that is already the user's is
kept, a cgroup left from before is emptied and made again, the spec is rewritten whole.

The request (JSON, one line on the server's pipe):
  run_dir    the attempt's (or rank's) directory, the head's own (0700)
  spec       the shim's spec (local.py `shim_spec`), written to RUN_DIR/spec.json
  durable    whether that write is fsync'd (a container job's: its cleanup after a crash reads it)
  job_dir    the job's own directory, made for `user` the first time (or null)
  user       the account the job runs as (null: the head's)
  cgroup     null, or {"support": CgroupSupport.to_json(), "instance": ..., "leaf": ...}
  gpu_minors the /dev/nvidia<N> the job may open (null: no fence)
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Callable
from typing import Any

try:
    from gpucluster.errors import GpuclusterError
except ImportError:  # loaded by path by the fork server (python -I -S), where the package is not importable
    GpuclusterError = Exception  # type: ignore[misc,assignment]

SPEC = "spec.json"


class Refused(GpuclusterError):
    """The start cannot be made (no such account, a job directory that is not the user's): the
    job fails to start with this message."""


def prepare_job_dir(job_dir: str, user: str | None) -> None:
    """The job's own directory, made for `user` (0700, owned by it) the first time.

    Its parent is the head's (the user cannot swap the directory for a link), and nothing inside
    it is ever made, opened or changed as root: the job's processes make their logs and
    checkpoints themselves. An existing one must already be that account's real directory.
    """
    if user is None:
        os.makedirs(job_dir, mode=0o700, exist_ok=True)
        return
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise Refused(f"there is no Unix account {user!r} on this node to run the job as") from None
    parent = os.path.dirname(job_dir)
    os.makedirs(parent, mode=0o711, exist_ok=True)
    os.chmod(parent, 0o711)  # others may pass through to their own job's directory, not list
    try:
        os.mkdir(job_dir, 0o700)
    except FileExistsError:
        st = os.lstat(job_dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != account.pw_uid:
            raise Refused(f"{job_dir} is not a directory of {user}'s: refusing to run the job there") from None
        return
    os.chown(job_dir, account.pw_uid, account.pw_gid, follow_symlinks=False)


def new_cgroup(cgroups: Any, support: Any, instance: str, leaf: str) -> Any:
    """The job process's cgroup, made afresh: one left by a start that did not finish (a head or
    server that died meanwhile) is killed and removed first, so nothing of it runs on."""
    try:
        return cgroups.create(support, instance, leaf)
    except FileExistsError:
        stale = cgroups.JobCgroup(cgroups.job_paths(support, instance, leaf))
        stale.kill()
        with contextlib.suppress(OSError):
            stale.remove()
        return cgroups.create(support, instance, leaf)


def apply_host_limits(cgroup: Any, env: dict[str, str]) -> None:
    """Write the CPUs and host memory a process was given (launch/env.py `host_limits`:
    GPUCLUSTER_CPUS, GPUCLUSTER_MEMORY_LIMIT in bytes) into its cgroup: cpu.max (or the v1 cfs
    quota) and memory.max (or v1 memory.limit_in_bytes). Where the node has no such controller
    the job runs unlimited, as `gpucluster up` says in its cgroups line."""
    cpus = env.get("GPUCLUSTER_CPUS")
    if cpus:
        cgroup.set_cpu_limit(float(cpus))
    memory = env.get("GPUCLUSTER_MEMORY_LIMIT")
    if memory:
        cgroup.set_memory_limit(int(memory))


def prepare(
    request: dict[str, Any], cgroups: Any, write_json: Callable[[str, dict[str, Any], bool], None]
) -> dict[str, str] | None:
    """Everything of a start before its keeper, in this order (each before anything can join
    the cgroup: no process ever runs unlimited or unfenced); the cgroup's paths, or None."""
    spec: dict[str, Any] = dict(request["spec"])
    if request.get("job_dir"):
        prepare_job_dir(request["job_dir"], request.get("user"))
    run_dir = request["run_dir"]
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    paths: dict[str, str] | None = None
    wanted = request.get("cgroup")
    if wanted:
        support = cgroups.CgroupSupport.from_json(wanted["support"])
        cgroup = new_cgroup(cgroups, support, wanted["instance"], wanted["leaf"])
        apply_host_limits(cgroup, spec.get("env") or {})
        minors = request.get("gpu_minors")
        if minors is not None:
            cgroup.fence_devices(int(m) for m in minors)
        paths = cgroup.to_json()
    spec["cgroup"] = paths or {}
    write_json(os.path.join(run_dir, SPEC), spec, bool(request.get("durable")))
    return paths
