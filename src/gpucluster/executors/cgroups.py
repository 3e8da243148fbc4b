"""Per-job cgroups: find, account, signal and kill a job's whole process tree through the kernel.

Why: a job's processes can leave its process group (setsid, double fork, daemons), so killing by
pgid lets them outlive the job, and guessing pids can signal a stranger. A cgroup is inherited by
every descendant and cannot be left by an unprivileged process, so the kernel itself keeps the
list of the job's processes: we read it (cgroup.procs), signal exactly it, and kill it whole
(cgroup v2 ``cgroup.kill``, or a v1 freezer freeze-kill-thaw, or SIGKILL rounds until empty).

Three kinds of node are handled, found by ``detect()`` from the files alone:

- pure cgroup v2 (``/sys/fs/cgroup`` is cgroup2),
- hybrid (v1 controllers at ``/sys/fs/cgroup/<controller>``, cgroup2 at ``/sys/fs/cgroup/unified``),
- v1 only,

and none (no cgroup filesystem, or not writable: not root), which ``CgroupSupport.describe()``
reports in the one line ``gpucluster up`` prints, saying what is lost.

Layout: each head has a parent ``gpucluster/<instance>`` below its own cgroup in every hierarchy
used (so a job stays inside whatever limits the head was started under), and each job a leaf
named by the caller, e.g. ``job-12-attempt-3-rank-0``. A job's paths (one directory per
hierarchy) are a plain ``dict[str, str]``, so the head stores them as JSON and a restarted head
gets the same ``JobCgroup`` back with ``JobCgroup.from_json``; ``leftovers()`` lists the job
cgroups found under the head's parent, for a cleanup at start.

Standard library only (and gpucluster.errors where the package is importable, for its errors'
root): the job shim runs under ``python -I -S`` and imports this file by path to call ``join()``
in its forked child, before it drops privileges.
"""

from __future__ import annotations

import errno
import os
import re
import select
import signal as _signal
import time
from collections.abc import Iterable, Mapping

try:
    from gpucluster.errors import GpuclusterError
except ImportError:  # loaded by path by the job shim (python -I -S), where the package is not importable
    GpuclusterError = Exception  # type: ignore[misc,assignment]

V2 = "v2"
"""The key of the cgroup v2 directory in a job's paths (the other keys are v1 controller names)."""

V1_CONTROLLERS = ("freezer", "cpuacct", "memory", "devices", "pids", "cpu")
"""The v1 hierarchies this module may use, each mounted at <root>/<name> by convention."""

CPU_PERIOD_US = 100_000
"""The period a job's CPU quota is given over (v2 cpu.max, v1 cpu.cfs_period_us): N CPUs are
N x 100 ms of CPU time per 100 ms, as Slurm and Kubernetes set it."""

NVIDIA_MAJOR = 195
"""The char major of /dev/nvidia<N> (minor N) and /dev/nvidiactl (minor 255)."""
NVIDIACTL_MINOR = 255

_NOT_LOST = "a job's background processes that leave its process group can outlive it, and CPU/memory are not accounted"


class CgroupError(OSError, GpuclusterError):
    """A cgroup operation that could not be done (e.g. removing a cgroup that still has processes)."""


# What `_valid_name` accepts: 1-200 ASCII letters, digits, '.', '_' and '-' ('.' and '..' apart).
# One match in C: the check per character in Python ran six times per job start and end
# (issue 18: the head's CPU per job).
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


def _valid_name(name: str, what: str) -> str:
    """A single path component we create: no '/', no '.'/'..', nothing a shell or a path could misread."""
    if _NAME.fullmatch(name) is None or name in (".", ".."):
        raise ValueError(f"invalid cgroup {what} name {name!r}: use 1-200 of [A-Za-z0-9._-], not '.' or '..'")
    return name


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, data: str) -> None:
    # Unbuffered: the kernel takes a cgroup file write as one operation and reports its error there.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def _own_cgroups(proc_self_cgroup: str) -> dict[str, str]:
    """This process's cgroup path per hierarchy (V2 for the "0::" line), from /proc/self/cgroup."""
    own: dict[str, str] = {}
    try:
        text = _read(proc_self_cgroup)
    except OSError:
        return own
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            own[V2] = path
        for c in controllers.split(","):
            if c:
                own[c] = path
    return own


def _below(mount: str, path: str | None) -> str:
    """The directory of cgroup `path` under `mount`, or the mount itself when it is not there.

    Not there when the process sees host paths but the container's cgroup is mounted as root
    (no cgroup namespace): the mount is then the cgroup we were put in.
    """
    if path and path != "/":
        d = os.path.join(mount, path.lstrip("/"))
        if os.path.isdir(d):
            return d
    return mount


def _has_cgroup_kill(mount: str, base: str, kernel_release: str) -> bool:
    """cgroup.kill (Linux 5.14) is in every non-root cgroup; the root has none, so look at a child,
    and with no child at all (a fresh hybrid mount) go by the kernel's version."""
    if os.path.exists(os.path.join(base, "cgroup.kill")):
        return True
    try:
        children = [e.path for e in os.scandir(mount) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return False
    if children:
        return any(os.path.exists(os.path.join(c, "cgroup.kill")) for c in children[:8])
    try:
        major, minor = (int(x) for x in kernel_release.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 14)


def _v2_memory(mount: str, base: str, controller: str = "memory") -> bool:
    """Whether job cgroups below `base` can have the v2 memory controller (or `controller`).

    A cgroup holding processes cannot enable controllers for its children (the "no internal
    processes" rule), except the real root (the one without cgroup.type; a container's namespace
    root has one): so below the root or an empty mount, or where memory is already enabled.
    """
    try:
        if controller in _read(os.path.join(base, "cgroup.subtree_control")).split():
            return True
        if base != mount or controller not in _read(os.path.join(mount, "cgroup.controllers")).split():
            return False
        return (
            not os.path.exists(os.path.join(mount, "cgroup.type"))
            or not _read(os.path.join(mount, "cgroup.procs")).split()
        )
    except OSError:
        return False


def _writable(d: str) -> bool:
    return os.access(d, os.W_OK) and os.access(os.path.join(d, "cgroup.procs"), os.W_OK)


class CgroupSupport:
    """What this node's cgroups give us, and where: the result of ``detect()``.

    layout: "v2" (unified at the root), "hybrid" (cgroup2 at <root>/unified plus v1), "v1" or "none".
    bases: hierarchy key (V2 or a v1 controller name) -> the directory the head's parent goes
    under, for each hierarchy a job joins; empty when cgroups are unusable.
    kill: "cgroup.kill", "freezer" or "loop" (SIGKILL rounds), or "" when unusable.
    cpu, memory: "v2", "v1" or "" (not accounted). devices: whether GPUs can be fenced (v1 devices).
    reason: why cgroups are unusable ("" when usable). cpu_limit: where a job's CPU quota
    (`--cpus`) is written: "v2" (cpu.max), "v1" (the cpu hierarchy's cfs quota) or "" (nowhere).
    """

    __slots__ = ("bases", "cpu", "cpu_limit", "devices", "kill", "layout", "memory", "reason", "v2_mount")

    def __init__(
        self,
        layout: str,
        bases: Mapping[str, str],
        kill: str,
        cpu: str,
        memory: str,
        devices: bool,
        reason: str = "",
        v2_mount: str = "",
    ) -> None:
        self.layout = layout
        self.bases = dict(bases)
        self.kill = kill
        self.cpu = cpu
        self.memory = memory
        self.devices = devices
        self.reason = reason
        self.v2_mount = v2_mount
        self.cpu_limit = ""

    @property
    def usable(self) -> bool:
        return bool(self.bases)

    def to_json(self) -> dict[str, object]:
        """Every field, for the node's fork server (_node_start.py), which makes job cgroups
        where this head's detection found them."""
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> CgroupSupport:
        found = cls(
            str(data["layout"]),
            {str(k): str(v) for k, v in dict(data["bases"]).items()},  # type: ignore[call-overload]
            str(data["kill"]),
            str(data["cpu"]),
            str(data["memory"]),
            bool(data["devices"]),
            str(data["reason"]),
            str(data["v2_mount"]),
        )
        found.cpu_limit = str(data["cpu_limit"])
        return found

    def __repr__(self) -> str:
        return (
            f"CgroupSupport(layout={self.layout!r}, bases={self.bases!r}, kill={self.kill!r}, cpu={self.cpu!r}, "
            f"memory={self.memory!r}, devices={self.devices!r}, reason={self.reason!r})"
        )

    def describe(self) -> str:
        """The one line `gpucluster up` prints: what jobs get from cgroups here, and what is lost."""
        if not self.usable:
            return f"cgroups unavailable ({self.reason}): {_NOT_LOST}"
        where = "v1"
        if V2 in self.bases:
            where = f"v2 at {self.v2_mount}" + (" with v1" if self.layout == "hybrid" else "")
        have = [
            {"cgroup.kill": "kill", "freezer": "kill via v1 freezer", "loop": "kill by SIGKILL rounds"}[self.kill],
            f"CPU via {'v2 cpu.stat' if self.cpu == V2 else 'v1 cpuacct'}" if self.cpu else "",
            f"memory via {'v2 memory' if self.memory == V2 else 'v1 memory'}" if self.memory else "",
            "GPU device fence via v1 devices" if self.devices else "",
        ]
        lost = [
            "" if self.cpu else "CPU accounting",
            "" if self.memory else "memory accounting",
            ""
            if self.devices
            else "GPU device fence (cgroup v2 needs eBPF for it: a job can open GPUs it was not given)",
        ]
        line = f"cgroups: {where} ({', '.join(h for h in have if h)})"
        if any(lost):
            line += "; lost: " + ", ".join(x for x in lost if x)
        return line

    def parent_paths(self, instance: str) -> dict[str, str]:
        """The head's parent cgroup per hierarchy: <base>/gpucluster/<instance>."""
        _valid_name(instance, "head instance")
        return {k: os.path.join(b, "gpucluster", instance) for k, b in self.bases.items()}


def detect(
    root: str = "/sys/fs/cgroup", proc_self_cgroup: str = "/proc/self/cgroup", kernel_release: str | None = None
) -> CgroupSupport:
    """Find the cgroup layout under `root` and, per need, the hierarchy that serves it.

    Reads files only (creates nothing), so it is safe at every start and works on a fake tree
    (`proc_self_cgroup` and `kernel_release`, default os.uname()'s, stand in for this process's).
    """
    release = os.uname().release if kernel_release is None else kernel_release
    if not os.path.isdir(root):
        return CgroupSupport("none", {}, "", "", "", False, f"no cgroup filesystem at {root}")
    v2_mount = ""
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        v2_mount = root
    elif os.path.exists(os.path.join(root, "unified", "cgroup.controllers")):
        v2_mount = os.path.join(root, "unified")
    v1: dict[str, str] = {}
    if v2_mount != root:
        for c in V1_CONTROLLERS:
            d = os.path.join(root, c)
            # "tasks" is v1-only; a co-mounted controller (cpu,cpuacct) is reached through its symlink.
            if os.path.isdir(d) and os.path.exists(os.path.join(d, "tasks")):
                v1[c] = os.path.realpath(d)
    layout = "v2" if v2_mount and not v1 else "hybrid" if v2_mount else "v1" if v1 else "none"
    if layout == "none":
        return CgroupSupport("none", {}, "", "", "", False, f"no cgroup hierarchy found at {root}")

    own = _own_cgroups(proc_self_cgroup)
    v2_base = ""
    if v2_mount:
        v2_base = _below(v2_mount, own.get(V2))
        # Our own cgroup holds us, so it cannot give jobs the memory controller; the root can.
        if v2_base != v2_mount and not _v2_memory(v2_mount, v2_base) and _v2_memory(v2_mount, v2_mount):
            v2_base = v2_mount if _writable(v2_mount) else v2_base
        if not _writable(v2_base):
            v2_base = ""
    v1_bases = {c: _below(m, own.get(c)) for c, m in v1.items()}
    v1_bases = {c: d for c, d in v1_bases.items() if _writable(d)}
    if not v2_base and not v1_bases:
        why = "not writable" if os.geteuid() == 0 else "not root"
        return CgroupSupport(layout, {}, "", "", "", False, f"{layout} at {root}, {why}", v2_mount)

    bases: dict[str, str] = {}
    if v2_base:
        bases[V2] = v2_base
    if v2_base and _has_cgroup_kill(v2_mount, v2_base, release):
        kill = "cgroup.kill"
    elif "freezer" in v1_bases:
        kill = "freezer"
        bases["freezer"] = v1_bases["freezer"]
    else:
        kill = "loop"
    if v2_base and os.path.exists(os.path.join(v2_base, "cpu.stat")):
        cpu = V2
    elif "cpuacct" in v1_bases:
        cpu = "v1"
        bases["cpuacct"] = v1_bases["cpuacct"]
    else:
        cpu = ""
    if v2_base and _v2_memory(v2_mount, v2_base):
        memory = V2
    elif "memory" in v1_bases:
        memory = "v1"
        bases["memory"] = v1_bases["memory"]
    else:
        memory = ""
    devices = "devices" in v1_bases
    if devices:
        bases["devices"] = v1_bases["devices"]
    # Where `--cpus` is enforced: v2 cpu.max where jobs can have the cpu controller, else the
    # v1 cpu hierarchy (a hybrid node's CPU controller is bound there).
    cpu_limit = ""
    if v2_base and _v2_memory(v2_mount, v2_base, "cpu"):
        cpu_limit = V2
    elif "cpu" in v1_bases and bases:
        cpu_limit = "v1"
        bases["cpu"] = v1_bases["cpu"]
    if not bases:  # v1 with none of the above: pids (or any) still lists the tree to kill it
        c = "pids" if "pids" in v1_bases else next(iter(v1_bases))
        bases[c] = v1_bases[c]
    found = CgroupSupport(layout, bases, kill, cpu, memory, devices, "", v2_mount)
    found.cpu_limit = cpu_limit
    return found


def _make_dir(path: str) -> None:
    """mkdir -p that survives another head (or test) removing an empty shared parent meanwhile."""
    for _ in range(5):
        try:
            os.makedirs(path, exist_ok=True)
            return
        except FileNotFoundError:
            continue
    os.makedirs(path, exist_ok=True)


def _enable_v2_memory(base: str, leaf_parent: str, controller: str = "memory") -> None:
    """Turn the memory controller (or `controller`) on from `base` down to `leaf_parent`, so its
    children get memory.* (cpu.*) files."""
    dirs = [base]
    for part in os.path.relpath(leaf_parent, base).split(os.sep):
        dirs.append(os.path.join(dirs[-1], part))
    for d in dirs:
        path = os.path.join(d, "cgroup.subtree_control")
        try:
            if controller not in _read(path).split():
                _write(path, "+" + controller)
        except OSError:
            return  # then memory.current is missing and usage() says None: detect() already reported it


# A job's cgroup is named after its job, attempt and rank (the executor makes it, telemetry reads
# it back from /proc/PID/cgroup to attribute GPU processes): the one place that name is spelled.
_JOB_NAME = re.compile(r"/gpucluster/[^/]+/job-(\d+)-attempt-\d+(?:-rank-\d+)?(?:/|$)")


def job_name(job_id: int, attempt: int, rank: int | None = None) -> str:
    """The cgroup name of one process of a job's attempt (`rank` for a multi-process attempt)."""
    return f"job-{job_id}-attempt-{attempt}" + ("" if rank is None else f"-rank-{rank}")


def job_in(cgroup_path: str) -> int | None:
    """The job id in a cgroup path one of our job cgroups holds (a /proc/PID/cgroup line's path), if any."""
    found = _JOB_NAME.search(cgroup_path)
    return int(found.group(1)) if found else None


def job_paths(support: CgroupSupport, instance: str, name: str) -> dict[str, str]:
    """Where the job cgroup `name` of this head is (or would be), per hierarchy."""
    _valid_name(name, "job")
    return {key: os.path.join(parent, name) for key, parent in support.parent_paths(instance).items()}


def create(support: CgroupSupport, instance: str, name: str) -> JobCgroup:
    """Make the job cgroup `name` under the head's parent gpucluster/<instance>, in every hierarchy used.

    Raises ValueError for a bad name, FileExistsError if that job cgroup is already there (a
    leftover to kill and remove first: reusing it would mix two jobs), CgroupError if unusable.
    """
    wanted = job_paths(support, instance, name)
    if not support.usable:
        raise CgroupError(errno.ENOTSUP, f"cgroups unavailable: {support.reason}")
    paths: dict[str, str] = {}
    try:
        for key, path in wanted.items():
            parent = os.path.dirname(path)
            _make_dir(parent)
            if key == V2 and support.memory == V2:
                _enable_v2_memory(support.bases[V2], parent)
            if key == V2 and support.cpu_limit == V2:
                _enable_v2_memory(support.bases[V2], parent, "cpu")
            os.mkdir(path)
            paths[key] = path
    except BaseException:
        JobCgroup(paths).remove()
        raise
    return JobCgroup(paths)


def join(paths: Mapping[str, str], pid: int = 0) -> None:
    """Move process `pid` (0: the caller) into the job cgroup in every hierarchy.

    The shim calls it in its forked child before dropping privileges and exec: every process the
    job then starts is born inside. Cheap: one write per hierarchy.
    """
    for path in paths.values():
        _write(os.path.join(path, "cgroup.procs"), str(pid))


def _pidfd_open(pid: int) -> int | None:
    """A pidfd for `pid`, or -1 where the kernel has none (before 5.3), or None if it is gone."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EINVAL):
            return -1
        raise


class Usage:
    """A job cgroup's accounting: CPU seconds (user+system) and memory bytes; None where not accounted."""

    __slots__ = ("cpu_s", "memory_bytes", "memory_peak_bytes")

    def __init__(self, cpu_s: float | None, memory_bytes: int | None, memory_peak_bytes: int | None) -> None:
        self.cpu_s = cpu_s
        self.memory_bytes = memory_bytes
        self.memory_peak_bytes = memory_peak_bytes

    def __repr__(self) -> str:
        return f"Usage(cpu_s={self.cpu_s!r}, memory_bytes={self.memory_bytes!r}, peak={self.memory_peak_bytes!r})"


class JobCgroup:
    """One job's cgroup: a directory per hierarchy (key V2 or a v1 controller name -> path).

    Built by ``create()``, or from stored paths by ``JobCgroup.from_json`` after a head restart.
    """

    __slots__ = ("paths",)

    def __init__(self, paths: Mapping[str, str]) -> None:
        self.paths = dict(paths)

    def __repr__(self) -> str:
        return f"JobCgroup({self.paths!r})"

    def to_json(self) -> dict[str, str]:
        return dict(self.paths)

    @classmethod
    def from_json(cls, data: Mapping[str, str]) -> JobCgroup:
        """Recover a job's cgroup from what to_json() gave; its directories may be gone (then it is empty)."""
        paths = {str(k): str(v) for k, v in data.items()}
        for k, v in paths.items():
            if not (k == V2 or k in V1_CONTROLLERS) or not os.path.isabs(v):
                raise ValueError(f"not a job cgroup path: {k}={v!r}")
            _valid_name(os.path.basename(v), "job")
        return cls(paths)

    def join(self, pid: int = 0) -> None:
        join(self.paths, pid)

    def _procs(self, path: str) -> set[int]:
        try:
            return {int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()}
        except FileNotFoundError:
            return set()

    def pids(self) -> list[int]:
        """Every process in the job, the union over its hierarchies (a process is in all of them)."""
        found: set[int] = set()
        for path in self.paths.values():
            found |= self._procs(path)
        return sorted(found)

    def signal(self, signum: int) -> int:
        """Send `signum` to every process in the cgroup; returns how many were signalled.

        Race-free against pid reuse: each pid gets a pidfd first, and is signalled through it only
        if the pid is still in the cgroup after the pidfd was taken, so the pidfd is that member.
        """
        fds: dict[int, int] = {}
        try:
            for pid in self.pids():
                fd = _pidfd_open(pid)
                if fd is not None:
                    fds[pid] = fd
            members = set(self.pids())
            sent = 0
            for pid, fd in fds.items():
                if pid not in members:
                    continue
                try:
                    if fd >= 0:
                        _signal.pidfd_send_signal(fd, signum)
                    else:
                        os.kill(pid, signum)
                    sent += 1
                except ProcessLookupError:
                    pass
            return sent
        finally:
            for fd in fds.values():
                if fd >= 0:
                    os.close(fd)

    def kill(self, timeout: float = 10.0) -> bool:
        """SIGKILL the whole tree, forks racing it included; True once the cgroup is empty.

        v2 cgroup.kill kills atomically in the kernel; a v1 freezer first stops every process so
        none can fork while the frozen set is killed; otherwise SIGKILL rounds until empty.
        """
        v2 = self.paths.get(V2)
        if v2 is not None and os.path.exists(os.path.join(v2, "cgroup.kill")):
            _write(os.path.join(v2, "cgroup.kill"), "1")
            return self.wait_empty(timeout)
        freezer = self.paths.get("freezer")
        if freezer is not None and os.path.isdir(freezer):
            return self._freeze_kill(freezer, timeout)
        deadline = time.monotonic() + timeout
        while self.signal(_signal.SIGKILL):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return self.wait_empty(max(0.0, deadline - time.monotonic()))

    def _freeze_kill(self, freezer: str, timeout: float) -> bool:
        state = os.path.join(freezer, "freezer.state")
        deadline = time.monotonic() + timeout
        try:
            _write(state, "FROZEN")
            delay = 0.001
            while _read(state).strip() != "FROZEN" and time.monotonic() < deadline:
                time.sleep(delay)  # FREEZING: the kernel is still stopping tasks; nothing to wait on
                delay = min(delay * 2, 0.05)
            self.signal(_signal.SIGKILL)
        finally:
            _write(state, "THAWED")  # killed tasks die only once thawed
        while self.signal(_signal.SIGKILL):  # any that were not frozen in time
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return self.wait_empty(max(0.0, deadline - time.monotonic()))

    def wait_empty(self, timeout: float) -> bool:
        """Wait until no process is left; True if so within `timeout` seconds.

        On v2 it sleeps on cgroup.events (the kernel wakes pollers when "populated" changes);
        on v1 it polls cgroup.procs.
        """
        deadline = time.monotonic() + timeout
        v2 = self.paths.get(V2)
        events = os.path.join(v2, "cgroup.events") if v2 is not None else ""
        if events and os.path.exists(events):
            try:
                fd = os.open(events, os.O_RDONLY)
            except FileNotFoundError:
                fd = -1
            if fd >= 0:
                try:
                    poller = select.poll()
                    poller.register(fd, select.POLLPRI | select.POLLERR)
                    while True:
                        text = os.pread(fd, 4096, 0).decode()
                        if "populated 0" in text and not self.pids():
                            return True
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return False
                        poller.poll(min(left, 0.5) * 1000)
                finally:
                    os.close(fd)
        delay = 0.001
        while self.pids():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        return True

    def remove(self) -> None:
        """Remove the job's directory in every hierarchy; already gone is fine (idempotent).

        Raises CgroupError if processes are still in it: kill() and wait_empty() first.
        """
        busy = []
        for path in self.paths.values():
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno != errno.EBUSY:
                    raise
                busy.append(path)
        if busy:
            raise CgroupError(errno.EBUSY, f"job cgroup still has processes: {', '.join(busy)}")

    def usage(self) -> Usage:
        """CPU seconds and memory bytes (current and peak) of the job so far; None where not accounted.

        CPU includes processes that have already exited; read it before remove().
        """
        return Usage(self._cpu_s(), self._memory("memory.current", "memory.usage_in_bytes"), self._peak())

    def _cpu_s(self) -> float | None:
        v2 = self.paths.get(V2)
        if v2 is not None:
            try:
                for line in _read(os.path.join(v2, "cpu.stat")).splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) / 1e6
            except OSError:
                pass
        if "cpuacct" in self.paths:
            try:
                return int(_read(os.path.join(self.paths["cpuacct"], "cpuacct.usage"))) / 1e9
            except OSError:
                pass
        return None

    def _memory(self, v2_file: str, v1_file: str) -> int | None:
        for key, file in ((V2, v2_file), ("memory", v1_file)):
            if key in self.paths:
                try:
                    return int(_read(os.path.join(self.paths[key], file)))
                except (OSError, ValueError):
                    pass
        return None

    def _peak(self) -> int | None:
        return self._memory("memory.peak", "memory.max_usage_in_bytes")

    def set_memory_limit(self, limit_bytes: int) -> bool:
        """Cap the job's memory (v2 memory.max, or v1 memory.limit_in_bytes); False where unsupported."""
        for key, file in ((V2, "memory.max"), ("memory", "memory.limit_in_bytes")):
            path = os.path.join(self.paths[key], file) if key in self.paths else ""
            if path and os.path.exists(path):
                _write(path, str(int(limit_bytes)))
                return True
        return False

    def set_cpu_limit(self, cpus: float) -> bool:
        """Cap the job at `cpus` CPUs of time: v2 cpu.max "quota period", or v1 cpu.cfs_quota_us
        over cpu.cfs_period_us; quota = cpus x CPU_PERIOD_US. False where neither is there."""
        quota = max(1000, round(cpus * CPU_PERIOD_US))  # the kernel's least quota is 1 ms
        v2 = self.paths.get(V2)
        if v2 is not None and os.path.exists(os.path.join(v2, "cpu.max")):
            _write(os.path.join(v2, "cpu.max"), f"{quota} {CPU_PERIOD_US}")
            return True
        v1 = self.paths.get("cpu")
        if v1 is not None and os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")):
            _write(os.path.join(v1, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
            _write(os.path.join(v1, "cpu.cfs_quota_us"), str(quota))
            return True
        return False

    def fence_devices(self, allowed_gpu_minors: Iterable[int]) -> bool:
        """Deny the job every NVIDIA GPU (/dev/nvidia<N>, char 195:N) but `allowed_gpu_minors`.

        /dev/nvidiactl (195:255) and nvidia-uvm (its own major) stay open: CUDA needs them. Only
        the GPU char devices get deny rules, so everything else (InfiniBand, ttys) stays as the
        parent allows. Needs the v1 devices hierarchy; False (nothing done) where there is none.
        Call it before join(): a process's already-open files are not re-checked.
        """
        devices = self.paths.get("devices")
        if devices is None:
            return False
        allowed = set(allowed_gpu_minors)
        deny = os.path.join(devices, "devices.deny")
        for minor in range(NVIDIACTL_MINOR):
            if minor not in allowed:
                _write(deny, f"c {NVIDIA_MAJOR}:{minor} rwm")
        return True


def leftovers(support: CgroupSupport, instance: str) -> list[JobCgroup]:
    """The job cgroups under this head's parent, e.g. left by a crashed head: kill and remove them at start.

    A job missing from some hierarchy still comes back with the directories it has.
    """
    found: dict[str, dict[str, str]] = {}
    for key, parent in support.parent_paths(instance).items():
        try:
            entries = [e for e in os.scandir(parent) if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            continue
        for e in entries:
            found.setdefault(e.name, {})[key] = e.path
    return [JobCgroup(paths) for _, paths in sorted(found.items())]


def remove_parent(support: CgroupSupport, instance: str) -> None:
    """Remove the head's parent gpucluster/<instance> (and gpucluster/ when no other head uses it).

    Fails with CgroupError while a job cgroup is still below it; an absent one is fine.
    """
    for parent in support.parent_paths(instance).values():
        for d in (parent, os.path.dirname(parent)):
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    raise
                if d == parent:
                    raise CgroupError(e.errno, f"head cgroup still has job cgroups: {parent}") from None
                break
