"""Per-job cgroups (gpucluster.executors.cgroups) on this node's real cgroups, and detect() on fake trees.

The real-cgroup tests need root and a writable cgroup filesystem (CI has a hybrid v1+v2 one);
elsewhere they skip and say why. Each test makes its own head instance (a unique parent
gpucluster/<instance>) and removes it, its job cgroups and its processes, by path and by pid.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster.executors import cgroups
from gpucluster.executors.cgroups import V2, CgroupSupport, JobCgroup

WAIT_S = 10.0  # the longest any event here is waited for: a hang fails the test, not the run
ROOT = "/sys/fs/cgroup"


def _real_support() -> CgroupSupport:
    support = cgroups.detect()
    if not support.usable:
        pytest.skip(f"needs writable cgroups: {support.describe()}")
    return support


class Instance:
    """One head's parent cgroup for one test; tracks what it made so teardown removes exactly that."""

    def __init__(self, support: CgroupSupport) -> None:
        self.support = support
        self.name = f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.jobs: list[JobCgroup] = []
        self.procs: list[subprocess.Popen[str]] = []

    def create(self, leaf: str = "job-1-attempt-1-rank-0") -> JobCgroup:
        job = cgroups.create(self.support, self.name, leaf)
        self.jobs.append(job)
        return job

    def start(self, code: str, job: JobCgroup | None = None) -> subprocess.Popen[str]:
        """A Python child running `code`, born inside `job` (joined between fork and exec, as the shim does)."""
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", textwrap.dedent(code)],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=(lambda: job.join()) if job is not None else None,
        )
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(WAIT_S)
            if proc.stdout is not None:
                proc.stdout.close()
        for job in self.jobs:
            job.kill(WAIT_S)
            job.remove()
        cgroups.remove_parent(self.support, self.name)


@pytest.fixture
def instance() -> Iterator[Instance]:
    inst = Instance(_real_support())
    try:
        yield inst
    finally:
        inst.close()


def _pidfd(pid: int) -> int:
    return os.pidfd_open(pid)


def _exited(pidfd: int, timeout: float = WAIT_S) -> bool:
    """Whether the process behind `pidfd` exits within `timeout` (a pidfd turns readable when it does)."""
    ready, _, _ = select.select([pidfd], [], [], timeout)
    return bool(ready)


def _line(proc: subprocess.Popen[str]) -> str:
    """The child's next line: it prints one when it is ready (stdout closes, so this cannot hang, if it dies)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], WAIT_S)
    assert ready, "child printed nothing in time"
    return proc.stdout.readline().strip()


# A job whose tree escapes its process group and session: a double-forked setsid daemon. It
# says its pid once its parent has exited (it was reparented), so the job holds exactly the
# leader and the daemon when the test reads it: printed at once, a loaded machine let the test
# read the cgroup while the middle process was still there (CI saw three pids).
ESCAPING_TREE = """
    import os, time
    if os.fork() == 0:
        os.setsid()
        middle = os.getpid()
        if os.fork() == 0:
            while os.getppid() == middle:
                time.sleep(0.01)
            print(os.getpid(), flush=True)
            time.sleep(1000)
        os._exit(0)
    time.sleep(1000)
"""


def test_escaped_grandchild_is_found_and_killed_and_nothing_outside_is_signalled(instance: Instance) -> None:
    job = instance.create()
    outside = instance.start("import time; print('up', flush=True); time.sleep(1000)")
    assert _line(outside) == "up"
    leader = instance.start(ESCAPING_TREE, job)
    daemon = int(_line(leader))
    assert os.getsid(daemon) != os.getsid(leader.pid)
    assert os.getpgid(daemon) != os.getpgid(leader.pid)
    assert set(job.pids()) == {leader.pid, daemon}
    assert outside.pid not in job.pids()
    daemon_fd = _pidfd(daemon)
    try:
        assert job.kill(WAIT_S)
        assert leader.wait(WAIT_S) == -signal.SIGKILL
        assert _exited(daemon_fd)
    finally:
        os.close(daemon_fd)
    assert job.pids() == []
    assert outside.poll() is None, "a process outside the job's cgroup was signalled"


def test_signal_reaches_every_process_in_the_cgroup_only(instance: Instance) -> None:
    job = instance.create()
    outside = instance.start("import time; print('up', flush=True); time.sleep(1000)")
    assert _line(outside) == "up"
    leader = instance.start(ESCAPING_TREE, job)
    daemon_fd = _pidfd(int(_line(leader)))
    try:
        assert job.signal(signal.SIGTERM) == 2
        assert leader.wait(WAIT_S) == -signal.SIGTERM
        assert _exited(daemon_fd)
    finally:
        os.close(daemon_fd)
    assert job.wait_empty(WAIT_S)
    assert outside.poll() is None


def _one_hierarchy(key: str) -> CgroupSupport:
    """This node's cgroups, but only hierarchy `key`: to drive each kill mechanism on its own."""
    support = _real_support()
    if key == V2:
        base = support.bases.get(V2)
    else:
        d = os.path.join(ROOT, key)
        base = d if os.path.exists(os.path.join(d, "tasks")) and os.access(d, os.W_OK) else None
    if base is None:
        pytest.skip(f"no writable {key} hierarchy here")
    kill = {V2: "cgroup.kill", "freezer": "freezer"}.get(key, "loop")
    return CgroupSupport("test", {key: base}, kill, "", "", False)


@pytest.mark.parametrize("key", [V2, "freezer", "pids"], ids=["v2-cgroup.kill", "v1-freezer", "v1-sigkill-rounds"])
def test_each_kill_mechanism_kills_a_forking_tree(key: str) -> None:
    inst = Instance(_one_hierarchy(key))
    try:
        job = inst.create()
        if key == V2 and not os.path.exists(os.path.join(job.paths[V2], "cgroup.kill")):
            pytest.skip("this kernel has no cgroup.kill (before 5.14)")
        # Forks as fast as it can, so a kill must win against new children appearing.
        forker = inst.start(
            """
            import os, time
            print('up', flush=True)
            while True:
                try:
                    if os.fork() == 0:
                        time.sleep(1000)
                except OSError:
                    time.sleep(0.01)
            """,
            job,
        )
        assert _line(forker) == "up"
        assert job.kill(WAIT_S)
        assert forker.wait(WAIT_S) == -signal.SIGKILL
        assert job.pids() == []
    finally:
        inst.close()


def test_usage_counts_cpu_of_exited_processes_and_memory(instance: Instance) -> None:
    job = instance.create()
    busy = instance.start(
        """
        import time
        data = bytearray(32 << 20)  # touched: 32 MiB resident
        while time.process_time() < 0.3:
            pass
        """,
        job,
    )
    assert busy.wait(WAIT_S) == 0
    used = job.usage()
    if instance.support.cpu:
        assert used.cpu_s is not None and used.cpu_s >= 0.25
    else:
        assert used.cpu_s is None
    if instance.support.memory:
        assert used.memory_bytes is not None
        peak = used.memory_peak_bytes
        if peak is not None:  # memory.peak is Linux 5.19+ on v2
            assert peak >= 32 << 20
    else:
        assert used.memory_bytes is None


def test_memory_limit_is_written_where_memory_is_accounted(instance: Instance) -> None:
    job = instance.create()
    assert job.set_memory_limit(256 << 20) == bool(instance.support.memory)
    if instance.support.memory == V2:
        assert Path(job.paths[V2], "memory.max").read_text().strip() == str(256 << 20)
    elif instance.support.memory:
        assert Path(job.paths["memory"], "memory.limit_in_bytes").read_text().strip() == str(256 << 20)


def test_device_fence_denies_other_gpus_and_keeps_the_given_ones(instance: Instance, tmp_path: Path) -> None:
    """Real device nodes (char 195:N, made here) opened from inside the job.

    With no driver behind them an open fails ENXIO when the fence lets it through and EPERM when
    the devices cgroup denies it (devices.list cannot show this: a default-allow cgroup lists
    only "a *:* rwm", not its deny exceptions).
    """
    if not instance.support.devices:
        pytest.skip(f"no v1 devices hierarchy: {instance.support.describe()}")
    nodes = {}
    for minor in (0, 1, 2, cgroups.NVIDIACTL_MINOR):
        path = tmp_path / f"nvidia{minor}"
        try:
            os.mknod(path, 0o666 | 0o020000, os.makedev(cgroups.NVIDIA_MAJOR, minor))
        except PermissionError:
            pytest.skip("cannot mknod here (no CAP_MKNOD or a nodev mount)")
        nodes[minor] = str(path)
    job = instance.create()
    assert job.fence_devices([1])
    probe = instance.start(
        f"""
        import errno, os
        for minor, path in sorted({nodes!r}.items()):
            try:
                os.close(os.open(path, os.O_RDWR))
                print(minor, 'opened')
            except OSError as e:
                print(minor, errno.errorcode[e.errno])
        """,
        job,
    )
    out, _ = probe.communicate(timeout=WAIT_S)
    results = dict(line.split() for line in out.splitlines())
    assert results["0"] == "EPERM" and results["2"] == "EPERM"
    assert results["1"] != "EPERM" and results[str(cgroups.NVIDIACTL_MINOR)] != "EPERM"


def test_a_stored_cgroup_is_reattached_swept_and_removed_without_trace(instance: Instance) -> None:
    job = instance.create("job-7-attempt-2-rank-1")
    stored = json.dumps(job.to_json())
    again = JobCgroup.from_json(json.loads(stored))  # a restarted head
    sleeper = instance.start("import time; print('up', flush=True); time.sleep(1000)", again)
    assert _line(sleeper) == "up"
    assert job.pids() == [sleeper.pid]
    with pytest.raises(cgroups.CgroupError):
        again.remove()
    (left,) = cgroups.leftovers(instance.support, instance.name)
    assert left.paths == job.paths
    assert left.kill(WAIT_S)
    left.remove()
    left.remove()  # idempotent
    assert cgroups.leftovers(instance.support, instance.name) == []
    cgroups.remove_parent(instance.support, instance.name)
    for path in [*job.paths.values(), *instance.support.parent_paths(instance.name).values()]:
        assert not os.path.exists(path)


def test_create_refuses_bad_names_and_an_existing_job_cgroup(instance: Instance) -> None:
    for bad in ("", ".", "..", "a/b", "../x", "job 1", "jöb"):
        with pytest.raises(ValueError):
            cgroups.create(instance.support, instance.name, bad)
    instance.create("job-1")
    with pytest.raises(FileExistsError):
        cgroups.create(instance.support, instance.name, "job-1")
    with pytest.raises(ValueError):
        JobCgroup.from_json({"memory": "/sys/fs/cgroup/memory/gpucluster/x/.."})


def test_the_shim_can_load_it_by_path_under_isolated_python(instance: Instance) -> None:
    """What the job shim does: `python -I -S`, the module loaded from its file, join() before exec."""
    job = instance.create()
    code = f"""
        import importlib.util, os, sys
        spec = importlib.util.spec_from_file_location("cgroups", {cgroups.__file__!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.join({job.paths!r})
        print(os.getpid(), mod.detect().describe(), flush=True)
        sys.stdin.read()
    """
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    instance.procs.append(proc)
    pid, line = _line(proc).split(" ", 1)
    assert job.pids() == [int(pid)]
    assert line.startswith("cgroups: ")
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(WAIT_S) == 0


# detect() on fake trees: directories and files laid out like each kind of node.


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _v1(*controllers: str) -> dict[str, str]:
    return {f"{c}/{f}": "" for c in controllers for f in ("tasks", "cgroup.procs")}


def _detect(tmp_path: Path, files: dict[str, str], self_cgroup: str, release: str = "6.1.0") -> CgroupSupport:
    root = tmp_path / "cg"
    root.mkdir()
    _tree(root, files)
    (tmp_path / "self").write_text(self_cgroup)
    return cgroups.detect(str(root), str(tmp_path / "self"), release)


V2_ROOT = {
    "cgroup.controllers": "cpuset cpu io memory pids\n",
    "cgroup.subtree_control": "cpu memory pids\n",
    "cgroup.procs": "",
    "cpu.stat": "usage_usec 0\n",
    "init.scope/cgroup.kill": "",
    "init.scope/cgroup.procs": "",
}


def test_detect_pure_v2(tmp_path: Path) -> None:
    s = _detect(tmp_path, V2_ROOT, "0::/\n")
    root = str(tmp_path / "cg")
    assert (s.layout, s.bases, s.kill, s.cpu, s.memory, s.devices) == ("v2", {V2: root}, "cgroup.kill", V2, V2, False)
    assert s.describe() == (
        f"cgroups: v2 at {root} (kill, CPU via v2 cpu.stat, memory via v2 memory); lost: GPU device fence "
        "(cgroup v2 needs eBPF for it: a job can open GPUs it was not given)"
    )
    assert s.parent_paths("head-a") == {V2: f"{root}/gpucluster/head-a"}


def test_detect_pure_v2_from_a_session_scope_puts_jobs_under_the_root_for_memory(tmp_path: Path) -> None:
    scope = "user.slice/session-2.scope"
    files = {**V2_ROOT, f"{scope}/cgroup.procs": "", f"{scope}/cgroup.subtree_control": "", f"{scope}/cpu.stat": ""}
    s = _detect(tmp_path, files, f"0::/{scope}\n")
    assert (s.bases, s.memory) == ({V2: str(tmp_path / "cg")}, V2)


def test_detect_pure_v2_in_a_container_with_processes_at_its_root_loses_memory(tmp_path: Path) -> None:
    files = {**V2_ROOT, "cgroup.type": "domain\n", "cgroup.procs": "1\n7\n", "cgroup.subtree_control": ""}
    s = _detect(tmp_path, files, "0::/\n")
    assert (s.layout, s.kill, s.cpu, s.memory) == ("v2", "cgroup.kill", V2, "")
    assert "; lost: memory accounting, GPU device fence" in s.describe()


def test_detect_hybrid_old_kernel_uses_v1_freezer_cpuacct_memory_devices(tmp_path: Path) -> None:
    files = {
        "unified/cgroup.controllers": "",
        "unified/cgroup.procs": "",
        "unified/cgroup.subtree_control": "",
        **_v1("freezer", "cpuacct", "memory", "devices", "pids"),
        "memory/sandbox/7/cgroup.procs": "",
    }
    s = _detect(tmp_path, files, "4:memory:/sandbox/7\n3:cpuacct:/\n0::/\n", release="4.19.0-25-amd64")
    cg = tmp_path / "cg"
    assert s.layout == "hybrid"
    assert s.bases == {
        V2: f"{cg}/unified",
        "freezer": f"{cg}/freezer",
        "cpuacct": f"{cg}/cpuacct",
        "memory": f"{cg}/memory/sandbox/7",  # under our own cgroup: jobs stay inside its limits
        "devices": f"{cg}/devices",
    }
    assert (s.kill, s.cpu, s.memory, s.devices) == ("freezer", "v1", "v1", True)
    assert s.describe() == (
        f"cgroups: v2 at {cg}/unified with v1 (kill via v1 freezer, CPU via v1 cpuacct, memory via v1 memory, "
        "GPU device fence via v1 devices)"
    )


def test_detect_hybrid_new_kernel_kills_through_v2(tmp_path: Path) -> None:
    files = {"unified/cgroup.controllers": "", "unified/cgroup.procs": "", "unified/cpu.stat": "", **_v1("memory")}
    s = _detect(tmp_path, files, "0::/\n", release="6.18.44-fc")
    assert (s.layout, s.kill, s.cpu, s.memory, s.devices) == ("hybrid", "cgroup.kill", V2, "v1", False)
    assert set(s.bases) == {V2, "memory"}


def test_detect_v1_only(tmp_path: Path) -> None:
    s = _detect(tmp_path, _v1("freezer", "cpuacct", "memory", "devices"), "2:freezer:/\n")
    assert (s.layout, s.kill, s.cpu, s.memory, s.devices) == ("v1", "freezer", "v1", "v1", True)
    assert s.describe().startswith("cgroups: v1 (kill via v1 freezer,")


def test_detect_v1_with_pids_only_kills_by_rounds(tmp_path: Path) -> None:
    s = _detect(tmp_path, _v1("pids"), "")
    assert (s.layout, s.bases, s.kill) == ("v1", {"pids": str(tmp_path / "cg" / "pids")}, "loop")
    assert s.describe().endswith(
        "(kill by SIGKILL rounds); lost: CPU accounting, memory accounting, GPU device "
        "fence (cgroup v2 needs eBPF for it: a job can open GPUs it was not given)"
    )


def test_detect_none(tmp_path: Path) -> None:
    s = _detect(tmp_path, {"README": ""}, "")
    assert (s.layout, s.usable) == ("none", False)
    assert s.describe().startswith("cgroups unavailable (no cgroup hierarchy found at ")
    with pytest.raises(cgroups.CgroupError):
        cgroups.create(s, "head-a", "job-1")
    missing = cgroups.detect(str(tmp_path / "absent"))
    assert not missing.usable and "no cgroup filesystem" in missing.describe()


def test_detect_not_writable_says_what_is_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As a non-root user would see it (tests run as root, to whom every file is writable).
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    s = _detect(tmp_path, V2_ROOT, "0::/\n")
    assert not s.usable
    assert s.describe() == (
        f"cgroups unavailable (v2 at {tmp_path / 'cg'}, not root): a job's background processes that leave its "
        "process group can outlive it, and CPU/memory are not accounted"
    )


def test_names_are_one_safe_path_component() -> None:
    s = CgroupSupport("v2", {V2: "/x"}, "cgroup.kill", V2, V2, False)
    for bad in ("", "..", "a/b", "x" * 201):
        with pytest.raises(ValueError):
            s.parent_paths(bad)
    assert s.parent_paths("head-1.b_c") == {V2: "/x/gpucluster/head-1.b_c"}
