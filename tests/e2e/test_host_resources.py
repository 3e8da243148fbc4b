"""End to end: CPU cores and host memory as resources beside GPUs (`--cpus`, `--mem`; issue 16)
on a live head and the real CLI.

The head declares a node of 4 GPUs but only 4 CPUs and 8 GiB (`up --cpus 4 --memory 8G`): two
1-GPU jobs that each fit by GPUs but not together by CPUs run one after the other, the second
waiting for CPUs under a reservation that holds them; a job's cgroup holds its CPU quota and
memory limit and its environment its thread count; requests no node could hold are refused at
submit in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpucluster.executors import cgroups
from tests.e2e.headproc import HeadProcess, wait_for
from tests.e2e.headproc import cli as run_cli
from tests.e2e.test_jobs import finished, running

# What a job reads of itself: its thread count and the limits in its own cgroup files.
PROBE = r"""
import os, sys
paths = {}
for line in open("/proc/self/cgroup").read().splitlines():
    hid, ctl, p = line.split(":", 2)
    if hid == "0":
        root = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
        paths["v2"] = root + p
    for c in ctl.split(","):
        if c:
            paths[c] = "/sys/fs/cgroup/" + c + p
def rd(d, f):
    try:
        return open(os.path.join(paths[d], f)).read().strip()
    except (KeyError, OSError):
        return None
print("OMP", os.environ.get("OMP_NUM_THREADS"), os.environ.get("GPUCLUSTER_CPUS"))
print("CPUMAX", rd("v2", "cpu.max"), rd("cpu", "cpu.cfs_quota_us"), rd("cpu", "cpu.cfs_period_us"))
print("MEMMAX", rd("v2", "memory.max"), rd("memory", "memory.limit_in_bytes"))
sys.stdout.flush()
import time; time.sleep(120)
"""


@pytest.fixture
def small(head_factory: type[HeadProcess], tmp_path: Path) -> HeadProcess:
    return head_factory(tmp_path / "data", gpus=4, extra_args=("--cpus", "4", "--memory", "8G")).start()


def submit(head: HeadProcess, *args: str) -> int:
    r = run_cli(head, "submit", "--json", *args)
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)["id"])


def _why(head: HeadProcess, job_id: int) -> dict[str, object]:
    r = run_cli(head, "why", str(job_id), "--json")
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    return out


def test_two_jobs_that_fit_by_gpus_but_not_by_cpus_run_one_after_the_other(small: HeadProcess) -> None:
    listing = json.loads(run_cli(small, "nodes", "--json").stdout)
    assert (listing[0]["cpus"], listing[0]["memory_mb"]) == (4, 8192)
    first = submit(small, "--gpus", "1", "--cpus", "3", "--mem", "1G", "--", sys.executable, "-c", PROBE)
    running(small, first, timeout=60)
    second = submit(small, "--gpus", "1", "--cpus", "2", "--", "true")
    why = wait_for(lambda: (w := _why(small, second))["wait_reason"] and w, 60, what="a cycle to consider it")
    # First in line for its GPUs' model: a reservation holds its GPU and CPUs from when the first
    # job's CPUs come back, and its wait says it waits for CPUs.
    assert (why["state"], why["wait_reason"]) == ("queued", "reserved"), why
    text = run_cli(small, "why", str(second)).stdout
    assert "waiting for CPUs: needs 2 CPU(s)" in text and "at most 1 CPU(s) left" in text, text
    assert "with 2 CPU(s) on node0 are held for it from" in text, text
    table = run_cli(small, "nodes").stdout
    assert "node0 CPUs 3/4 used, memory 1.0/8.0 GiB used" in table, table
    shown = json.loads(run_cli(small, "show", str(first), "--json").stdout)
    assert (shown["allocation"][0]["cpus"], shown["allocation"][0]["host_memory_mb"]) == (3, 1024), shown
    # The first job's own view of its limits (printed at its start).
    logs = wait_for(lambda: (t := run_cli(small, "logs", str(first)).stdout).count("\n") >= 3 and t, 60)
    lines = {line.split()[0]: line.split()[1:] for line in logs.splitlines() if line.split()}
    assert lines["OMP"] == ["3", "3"], logs
    support = cgroups.detect()
    if support.cpu_limit:
        assert "300000 100000" in logs or lines["CPUMAX"][1:] == ["300000", "100000"], logs
    if support.memory:
        assert str(1024**3) in lines["MEMMAX"], logs
    assert run_cli(small, "cancel", str(first)).returncode == 0
    assert finished(small, second, timeout=60).state.value == "succeeded"


def test_requests_no_node_can_hold_are_one_line_errors(small: HeadProcess) -> None:
    cases = [
        (["--cpus", "16"], "cpus: asks for 16 CPUs beside 1 GPU(s) but no node of this cluster has that many"),
        (["--mem", "64G"], "mem: asks for"),
        (["--mem", "lots"], "cannot read memory size 'lots'"),
        (["--cpus", "0"], "cpus must be at least 0.01"),
    ]
    for args, needle in cases:
        r = run_cli(small, "submit", *args, "--", "true")
        assert r.returncode == 1, (args, r.stdout)
        assert needle in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(run_cli(small, "jobs", "--json").stdout) == []
    helps = run_cli(small, "submit", "--help").stdout
    assert "--cpus" in helps and "--mem" in helps


def test_policy_defaults_are_written_into_the_spec_and_update_changes_a_waiting_job(
    head_factory: type[HeadProcess], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("resources: {cpus_per_gpu: 2, mem_per_gpu: 1G}\n")
    head = head_factory(
        tmp_path / "data", gpus=4, extra_args=("--cpus", "4", "--memory", "8G", "--policy", str(policy))
    ).start()
    shown = run_cli(head, "policy", "show").stdout
    assert "a job without --cpus/--mem gets per GPU: 2 CPU(s), 1 GiB of memory" in shown, shown
    busy = submit(head, "--gpus", "1", "--cpus", "3", "--", "sleep", "120")
    running(head, busy, timeout=60)
    waits = submit(head, "--gpus", "1", "--", "true")  # the default: 2 CPUs and 1 GiB; 1 CPU is left
    spec = json.loads(run_cli(head, "show", str(waits), "--json").stdout)["spec"]
    assert (spec["cpus"], spec["mem"]) == (2, 1024), spec
    wait_for(lambda: _why(head, waits)["wait_reason"] == "reserved", 60, what="it to wait for CPUs (reserved)")
    r = run_cli(head, "update", str(waits), "--cpus", "1")
    assert r.returncode == 0, r.stderr
    assert finished(head, waits, timeout=60).state.value == "succeeded"  # beside the busy job
    assert run_cli(head, "cancel", str(busy)).returncode == 0


def test_a_cpu_only_job_runs_beside_a_gpu_job_with_no_gpu_visible(small: HeadProcess) -> None:
    """`--gpus 0 --cpus 1 --mem 512M` (issue 26): placed by its CPUs and memory alone, it holds no
    GPU (all 4 stay free for the GPU job that runs beside it), sees no GPU (empty
    CUDA_VISIBLE_DEVICES), ends succeeded, and its attempt is accounted at 0 GPUs. A CPU-only
    request without CPUs or memory, or one no node can hold, is a one-line error at submit."""
    show = "import os; print('VISIBLE=[' + os.environ.get('CUDA_VISIBLE_DEVICES', 'unset') + ']')"
    cpu = submit(small, "--gpus", "0", "--cpus", "1", "--mem", "512M", "--", sys.executable, "-c", show)
    gpu = submit(small, "--gpus", "4", "--cpus", "2", "--", sys.executable, "-c", "print('gpu job')")
    assert finished(small, cpu, timeout=60).state.value == "succeeded"
    assert finished(small, gpu, timeout=60).state.value == "succeeded"
    shown = json.loads(run_cli(small, "show", str(cpu), "--json").stdout)
    assert [(s["gpu_indices"], s["cpus"], s["host_memory_mb"]) for s in shown["allocation"]] == [([], 1, 512)], shown
    assert shown["attempts"][-1]["gpus"] == 0, shown["attempts"]
    logs = wait_for(lambda: "VISIBLE" in (t := run_cli(small, "logs", str(cpu)).stdout) and t, 60, what="its log")
    assert "VISIBLE=[]" in logs, logs

    # Accounting: the CPU-only attempt holds 1 core and no GPU: CPU-hours, 0 GPU-hours, no cost
    # (prices are per GPU-hour); the GPU job's 2 cores count beside its GPU-hours.
    def usage_of(job_id: int) -> dict[str, float] | None:
        rows = json.loads(run_cli(small, "usage", "--by", "job", "--json").stdout)["rows"]
        row: dict[str, float] | None = next((r for r in rows if r["job_id"] == job_id), None)
        return row if row is not None and row["cpu_hours"] > 0 else None

    used = wait_for(lambda: usage_of(cpu), 60, what="the CPU-only attempt's accounting")
    assert used["gpu_hours"] == 0 and used["cost"] == 0 and used["gpu_model"] == "cpu-only", used
    gpu_used = wait_for(lambda: usage_of(gpu), 60, what="the GPU job's accounting")
    assert gpu_used["gpu_hours"] > 0 and gpu_used["cpu_hours"] == pytest.approx(gpu_used["gpu_hours"] / 2), gpu_used
    gpu_shown = json.loads(run_cli(small, "show", str(gpu), "--json").stdout)
    assert gpu_shown["allocation"][0]["gpu_indices"] == [0, 1, 2, 3], gpu_shown
    for args, needle in (
        (["--gpus", "0"], "gpus 0 is a CPU-only job: ask for CPU cores"),
        (
            ["--gpus", "0", "--cpus", "8"],
            "a CPU-only job asking for 8 CPU core(s) and 0 MiB of host memory fits no node (the most on one node: 4",
        ),
        (["--gpus", "0", "--cpus", "1", "--gpu-type", "H100"], "leave out gpu_type"),
    ):
        r = run_cli(small, "submit", *args, "--", "true")
        assert r.returncode == 1 and needle in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_head_whose_node_has_no_gpus_runs_cpu_only_jobs(head_factory: type[HeadProcess], tmp_path: Path) -> None:
    """`gpucluster up --virtual-gpus 0 --cpus 2 --memory 2G`: a node without GPUs (issue 26). A
    CPU-only job runs there to success; a GPU job is refused at submit saying the cluster has none."""
    head = head_factory(tmp_path / "data", gpus=0, extra_args=("--cpus", "2", "--memory", "2G")).start()
    listing = json.loads(run_cli(head, "nodes", "--json").stdout)
    assert [(n["gpus"], n["cpus"]) for n in listing] == [([], 2)], listing
    job_id = submit(head, "--gpus", "0", "--cpus", "1", "--mem", "256M", "--", "true")
    assert finished(head, job_id, timeout=60).state.value == "succeeded"
    r = run_cli(head, "submit", "--gpus", "1", "--", "true")
    assert r.returncode == 1 and "this cluster has no GPUs: only CPU-only jobs run here" in r.stderr, r.stderr
