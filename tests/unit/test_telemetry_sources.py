"""Telemetry sources and helpers: NVML readings through the fake module, pid -> job through real
processes, the drained snapshot, and the policy file's idle/health sections."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpucluster.core.types import Allocation, NodeSlice, RunningJob
from gpucluster.policyfile import PolicyFileError, load_policy
from gpucluster.telemetry.attribution import PidResolver, job_groups
from gpucluster.telemetry.drain import schedulable
from gpucluster.telemetry.nvml import NvmlSource

from .builders import node, running, snapshot
from .telemetrykit import load_fake_nvml


def test_nvml_source_reads_every_field_and_each_xid_once() -> None:
    nvml = load_fake_nvml()
    nvml.reset(
        [
            nvml.gpu(
                util=87,
                temp=71,
                power_w=412.5,
                memory_used_mb=2048,
                sm_clock=1755,
                mem_clock=2619,
                ecc=2,
                xids=[79],
                processes=[{"pid": 11, "memory_mb": 1500}],
            ),
            {"util": 0, "temp": 30},  # no ECC support on this one
        ]
    )
    src = NvmlSource("n1", nvml)
    r = src.read(100.0)
    g0, g1 = r.gpus
    assert (g0.utilization, g0.temperature_c, g0.power_w, g0.memory_used_mb) == (87, 71, 412.5, 2048)
    assert (g0.sm_clock_mhz, g0.memory_clock_mhz, g0.ecc_uncorrectable, g0.xids) == (1755, 2619, 2, (79,))
    assert [(p.pid, p.memory_mb, p.job_id) for p in g0.processes] == [(11, 1500, None)]
    assert g1.ecc_uncorrectable is None and g1.error is None
    assert src.read(105.0).gpus[0].xids == ()  # delivered once
    assert src.xids_supported


def test_nvml_failure_is_a_reading_with_the_error_and_recovers() -> None:
    nvml = load_fake_nvml()
    nvml.reset([nvml.gpu()])
    src = NvmlSource("n1", nvml)
    assert nvml.STATE is not None
    nvml.STATE["fail"] = "Driver Not Loaded"
    r = src.read(1.0)
    assert r.gpus == () and r.error is not None and "Driver Not Loaded" in r.error
    nvml.STATE["fail"] = None
    assert len(src.read(2.0).gpus) == 1


def test_pids_map_to_jobs_through_their_process_group_and_ancestors(tmp_path: Path) -> None:
    # A job's shim leads its own session; its child (the CUDA process) and grandchildren inherit it.
    script = tmp_path / "tree.sh"
    script.write_text(f"sleep 30 & echo $! > {tmp_path}/child; exec sleep 30\n")
    leader = subprocess.Popen(["sh", str(script)], start_new_session=True)
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        for _ in range(500):
            if (tmp_path / "child").exists() and (tmp_path / "child").read_text().strip():
                break
            time.sleep(0.01)
        child = int((tmp_path / "child").read_text())
        groups = job_groups([(7, {"pid": leader.pid, "pgid": leader.pid}), (8, None)])
        assert groups == {leader.pid: 7}
        found = PidResolver().resolve([leader.pid, child, stranger.pid, 999_999_999], groups)
        assert found == {leader.pid: 7, child: 7}
    finally:
        for p in (leader, stranger):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_drained_nodes_leave_the_snapshot_and_jobs_keep_their_other_slices() -> None:
    spanning = RunningJob(job_id=3, allocation=Allocation((NodeSlice("n1", (0, 1)), NodeSlice("n2", (0, 1)))))
    snap = snapshot(
        nodes=[node("n1").gpus(2, "H100").build(), node("n2").gpus(2, "H100").build()],
        running=[spanning, running(4, "n1", 0)],
    )
    out = schedulable(snap, frozenset({"n1"}))
    assert [n.name for n in out.nodes] == ["n2"]
    assert [(j.job_id, j.allocation.slices) for j in out.running] == [(3, (NodeSlice("n2", (0, 1)),))]
    assert schedulable(snap, frozenset()) is snap


def test_policy_file_idle_and_health_sections(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(
        "idle: {after: 45m, threshold: 2, action: requeue}\n"
        "health: {max_temperature: 85, node_timeout: 2m, drain_on_xid: false, fatal_xids: [79]}\n"
    )
    p = load_policy(f)
    assert (p.idle.after_s, p.idle.threshold, p.idle.action) == (2700, 2, "requeue")
    assert (p.health.max_temperature_c, p.health.node_timeout_s, p.health.drain_on_xid) == (85, 120, False)
    assert p.health.fatal_xids == frozenset({79})
    f.write_text("teams: {a: {}}\nidle:\n  action: kill\n")
    with pytest.raises(PolicyFileError, match=r"p.yaml:3: idle.action"):
        load_policy(f)
    f.write_text("health: {max_temperature: -5}\n")
    with pytest.raises(PolicyFileError, match="max_temperature is in degrees Celsius"):
        load_policy(f)


def test_a_process_in_a_jobs_cgroup_belongs_to_that_job_whatever_its_environment_claims(tmp_path: Path) -> None:
    """A process's cgroup cannot be left nor forged; its environment can: a process of job 8
    that sets GPUCLUSTER_JOB_ID=7 (to have job 7 stopped for using too much GPU memory) is job 8's."""
    proc = tmp_path / "proc"

    def fake(pid: int, cgroup: str, environ: str) -> None:
        d = proc / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(f"{pid} (x) S 1 {pid} {pid} 0")  # orphaned, its own group: no tree
        (d / "cgroup").write_text(cgroup)
        (d / "environ").write_bytes(environ.encode())

    fake(100, "4:memory:/gpucluster/head-ab/job-8-attempt-1-rank-0\n0::/gpucluster/head-ab/job-8-attempt-1\n",
         "GPUCLUSTER_JOB_ID=7\0")  # fmt: skip
    fake(101, "0::/user.slice\n", "GPUCLUSTER_JOB_ID=7\0")  # no job cgroup (a node without them)
    fake(102, "0::/gpucluster/head-ab/job-9-attempt-2\n", "")  # a job the head does not run now
    groups = {5000: 7, 5001: 8}
    assert PidResolver(str(proc)).resolve([100, 101, 102], groups) == {100: 8, 101: 7}
