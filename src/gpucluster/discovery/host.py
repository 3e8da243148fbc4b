"""This machine's CPU cores and host memory, as jobs may ask for them (`--cpus`, `--mem`).

Why not `os.cpu_count()` and the RAM on the box: a head started in a container, a systemd slice
or under `taskset` may use only part of the machine, and jobs run in cgroups below its own
(executors/cgroups.py), so they can never get more than it has. CPUs are the fewest of the
CPUs this process may run on (`sched_getaffinity`) and its cgroup's CPU quota (v2 `cpu.max`, v1
`cpu.cfs_quota_us`); memory is the least of MemTotal and its cgroup's memory limit, less a
reserve for the system and the head itself (`reserve_mb`).
"""

from __future__ import annotations

import os

# Memory kept back from jobs for the kernel, the head and its workers: a tenth of the machine,
# at least 512 MiB and at most 8 GiB.
MIN_RESERVE_MB = 512
MAX_RESERVE_MB = 8 * 1024


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _own_cgroup_dirs(root: str, proc_self_cgroup: str) -> dict[str, str]:
    """This process's cgroup directory per hierarchy key ("" for v2, else a v1 controller)."""
    out: dict[str, str] = {}
    text = _read(proc_self_cgroup) or ""
    unified = root if os.path.exists(os.path.join(root, "cgroup.controllers")) else os.path.join(root, "unified")
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and not controllers:
            out[""] = os.path.join(unified, path.lstrip("/"))
        for c in controllers.split(","):
            if c:
                out[c] = os.path.join(root, c, path.lstrip("/"))
    return out


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup", proc_self_cgroup: str = "/proc/self/cgroup") -> float | None:
    """CPUs this process's cgroup allows (quota / period); None: no quota."""
    dirs = _own_cgroup_dirs(root, proc_self_cgroup)
    v2 = dirs.get("")
    text = _read(os.path.join(v2, "cpu.max")) if v2 else None
    parts = text.split() if text else []
    if parts and parts[0] != "max":
        period = int(parts[1]) if len(parts) > 1 else 100_000
        if period > 0:
            return int(parts[0]) / period
    v1 = dirs.get("cpu")
    if v1:
        q, p = _read(os.path.join(v1, "cpu.cfs_quota_us")), _read(os.path.join(v1, "cpu.cfs_period_us"))
        if q and p and int(q) > 0 and int(p) > 0:
            return int(q) / int(p)
    return None


def cgroup_memory_limit_mb(root: str = "/sys/fs/cgroup", proc_self_cgroup: str = "/proc/self/cgroup") -> int | None:
    """MiB this process's cgroup may use; None: no limit."""
    dirs = _own_cgroup_dirs(root, proc_self_cgroup)
    for key, file in (("", "memory.max"), ("memory", "memory.limit_in_bytes")):
        d = dirs.get(key)
        text = _read(os.path.join(d, file)) if d else None
        if text and text.strip() != "max":
            value = int(text)
            if value < 2**60:  # v1 says "no limit" with a huge number
                return value // (1024 * 1024)
    return None


def mem_total_mb(meminfo: str = "/proc/meminfo") -> int | None:
    text = _read(meminfo) or ""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024  # kB
    return None


def reserve_mb(total_mb: int) -> int:
    return min(MAX_RESERVE_MB, max(MIN_RESERVE_MB, total_mb // 10))


def discover_cpus() -> float:
    """CPU cores jobs on this machine may use in all."""
    try:
        cpus: float = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cpus = float(os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, quota)
    return round(cpus, 2)


def discover_memory_mb() -> int | None:
    """Host memory (MiB) jobs on this machine may use in all: MemTotal or the head's cgroup limit,
    the lower, less the reserve; None where neither can be read."""
    total = mem_total_mb()
    limit = cgroup_memory_limit_mb()
    found = [v for v in (total, limit) if v is not None]
    if not found:
        return None
    least = min(found)
    return max(0, least - reserve_mb(least))
