"""The edges of `--cpus`/`--mem` (issue 16): validation with clear errors, the policy's per-GPU
defaults, what reaches the store and back, a job's environment, the cgroup files written, and
the node's discovered capacity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpucluster.core.policy import HostDefaults
from gpucluster.core.types import Allocation, NodeSlice
from gpucluster.discovery import host
from gpucluster.executors import cgroups
from gpucluster.executors._node_start import apply_host_limits
from gpucluster.launch.env import job_env
from gpucluster.models import JobSpec
from gpucluster.policyfile import PolicyFileError, load_policy
from gpucluster.store.store import allocation_from_json, allocation_to_json, request_from, request_json


def _spec(**kw: object) -> JobSpec:
    return JobSpec.model_validate({"command": ["true"], **kw})


def test_cpus_and_mem_are_read_and_bad_values_are_named() -> None:
    spec = _spec(cpus=8, mem="64G")
    assert (spec.cpus, spec.mem_mb) == (8, 64 * 1024)
    assert _spec(mem=512).mem_mb == 512  # a bare number is MiB
    for bad, words in [
        ({"cpus": 0}, "cpus must be at least 0.01"),
        ({"cpus": -2}, "cpus must be at least 0.01"),
        ({"cpus": 10**7}, "cpus must be at most 1048576"),
        ({"cpus": True}, ""),
        ({"mem": "lots"}, "cannot read memory size 'lots'"),
        ({"mem": "0G"}, "out of range"),
    ]:
        with pytest.raises(ValidationError) as e:
            _spec(**bad)
        assert words in str(e.value), (bad, str(e.value))


def test_policy_defaults_per_gpu() -> None:
    d = HostDefaults(cpus_per_gpu=4, mem_per_gpu_mb=32 * 1024)
    assert d.resolve(2, None, None) == (8, 64 * 1024)
    assert d.resolve(2, 3, None) == (3, 64 * 1024)  # what the job says wins
    assert d.resolve(0.5, None, 100) == (2, 100)  # a share of a GPU, a share of the default
    assert HostDefaults().resolve(8, None, None) == (None, None)  # default: nothing reserved


def test_the_policy_file_reads_resources(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("resources: {cpus_per_gpu: 6, mem_per_gpu: 48GiB}\n")
    assert load_policy(path).host == HostDefaults(6, 48 * 1024)
    path.write_text("resources: {cpus_per_gpu: 6, mem_per_gpu: lots}\n")
    with pytest.raises(PolicyFileError) as e:
        load_policy(path)
    assert "p.yaml:1" in str(e.value) and "mem_per_gpu" in str(e.value)
    path.write_text("resources: {cpus_per_gpu: -1}\n")
    with pytest.raises(PolicyFileError):
        load_policy(path)


def test_the_request_and_the_allocation_keep_cpus_and_memory_through_the_store() -> None:
    spec = _spec(gpus=2, cpus=6, mem="12G")
    request = request_from(1, 2, 1, 0.0, "t", request_json(spec))
    assert (request.cpus, request.mem_mb, request.host) == (6, 12 * 1024, True)
    assert not request_from(1, 2, 1, 0.0, "t", request_json(_spec(gpus=2))).host
    alloc = Allocation((NodeSlice("n0", (0, 1), cpus=6, host_memory_mb=12288), NodeSlice("n1", (3,))))
    assert allocation_from_json(allocation_to_json(alloc)) == alloc


def _env(s: NodeSlice, user_env: dict[str, str] | None = None) -> dict[str, str]:
    return job_env(
        base={},
        user_env=user_env or {},
        job_id=1,
        job_name="j",
        team="t",
        attempt=1,
        slice_=s,
        head_url="http://h",
        virtual_gpus=True,
    )


def test_a_job_is_told_its_cpus_and_its_thread_pools_are_sized_unless_it_says() -> None:
    env = _env(NodeSlice("n0", (0,), cpus=2.5, host_memory_mb=1024))
    assert env["GPUCLUSTER_CPUS"] == "2.5" and env["GPUCLUSTER_MEMORY_LIMIT"] == str(1024**3)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    mine = _env(NodeSlice("n0", (0,), cpus=4), {"OMP_NUM_THREADS": "16"})
    assert mine["OMP_NUM_THREADS"] == "16" and mine["OPENBLAS_NUM_THREADS"] == "4"
    bare = _env(NodeSlice("n0", (0,)))
    assert not {"GPUCLUSTER_CPUS", "GPUCLUSTER_MEMORY_LIMIT", "OMP_NUM_THREADS"} & set(bare)


def test_limits_are_written_into_the_cgroup_files(tmp_path: Path) -> None:
    """On a fake tree: v2 cpu.max and memory.max; v1 cfs quota and memory.limit_in_bytes."""
    v2 = tmp_path / "v2"
    v2.mkdir()
    # Empty stand-ins: a cgroup file takes a write whole, a regular file is not truncated by it.
    (v2 / "cpu.max").write_text("")
    (v2 / "memory.max").write_text("")
    apply_host_limits(
        cgroups.JobCgroup({cgroups.V2: str(v2)}), {"GPUCLUSTER_CPUS": "2.5", "GPUCLUSTER_MEMORY_LIMIT": "1024"}
    )
    assert (v2 / "cpu.max").read_text() == "250000 100000" and (v2 / "memory.max").read_text() == "1024"
    cpu, mem = tmp_path / "cpu", tmp_path / "memory"
    cpu.mkdir()
    mem.mkdir()
    for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us"):
        (cpu / f).write_text("")
    (mem / "memory.limit_in_bytes").write_text("")
    cg = cgroups.JobCgroup({"cpu": str(cpu), "memory": str(mem)})
    apply_host_limits(cg, {"GPUCLUSTER_CPUS": "0.001", "GPUCLUSTER_MEMORY_LIMIT": "2048"})
    assert (cpu / "cpu.cfs_quota_us").read_text() == "1000"  # the kernel's least: 1 ms a period
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (mem / "memory.limit_in_bytes").read_text() == "2048"
    apply_host_limits(cg, {})  # nothing asked: nothing written
    assert (cpu / "cpu.cfs_quota_us").read_text() == "1000"


def test_detect_finds_where_cpu_quotas_go(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    for rel, text in {
        "unified/cgroup.controllers": "",
        "unified/cgroup.procs": "",
        "memory/tasks": "",
        "memory/cgroup.procs": "",
        "cpu/tasks": "",
        "cpu/cgroup.procs": "",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "self").write_text("0::/\n")
    s = cgroups.detect(str(root), str(tmp_path / "self"), "6.1.0")
    if not s.usable:
        pytest.skip(f"needs to write the fake tree's files: {s.describe()}")
    assert s.cpu_limit == "v1" and s.bases["cpu"] == str(root / "cpu")


def test_the_node_capacity_found_here_is_within_the_machine() -> None:
    cpus = host.discover_cpus()
    assert 0 < cpus <= (os.cpu_count() or 1)
    memory = host.discover_memory_mb()
    total = host.mem_total_mb()
    if total is not None:
        assert memory is not None and 0 <= memory < total
    assert host.reserve_mb(1024) == 512 and host.reserve_mb(10**6) == 8192


def test_a_cgroup_quota_and_limit_are_read(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    (root / "job").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "job" / "cpu.max").write_text("150000 100000\n")
    (root / "job" / "memory.max").write_text(str(3 * 1024**3) + "\n")
    (tmp_path / "self").write_text("0::/job\n")
    assert host.cgroup_cpu_quota(str(root), str(tmp_path / "self")) == 1.5
    assert host.cgroup_memory_limit_mb(str(root), str(tmp_path / "self")) == 3072
    (root / "job" / "cpu.max").write_text("max 100000\n")
    (root / "job" / "memory.max").write_text("max\n")
    assert host.cgroup_cpu_quota(str(root), str(tmp_path / "self")) is None
    assert host.cgroup_memory_limit_mb(str(root), str(tmp_path / "self")) is None
