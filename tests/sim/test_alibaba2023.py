"""Alibaba's cluster-trace-gpu-v2023 pod lists (`--format alibaba2023`, issue 26): the documented
columns read into jobs with their GPU shares, CPUs, host memory and allowed models; the replay
held to each node's CPUs and memory; CPU-only pods replayed as CPU-only jobs, counted apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.sim.engine import Engine
from gpucluster.sim.metrics import run_metrics, waits_by_size
from gpucluster.sim.readers import detect_format, read_trace
from gpucluster.sim.scheduling import load_policy
from gpucluster.sim.spec import load_cluster_spec
from tests.sim.helpers import cluster_yaml

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)
# The README's sample rows (github.com/alibaba/clusterdata, cluster-trace-gpu-v2023), a pod that
# was never scheduled, and a CPU-only one.
PODS = HEADER + (
    "openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497\n"
    "openb-pod-0022,4000,15258,1,220,,BE,Running,9679175,9973826,9679175\n"
    "openb-pod-0035,16000,32768,1,1000,V100M16|V100M32,LS,Running,9967058,9968575,9967063\n"
    "openb-pod-0061,11908,47104,1,1000,,BE,Pending,10001278,10001403,\n"
    "openb-pod-0099,2000,4096,0,0,,BE,Running,9500000,9600000,9500000\n"
)
CLUSTER = """node_groups:
  - {name: big, count: 1, gpus_per_node: 8, gpu_model: G2, cpus_per_node: 96, memory_per_node: 384GiB}
  - {name: v100, count: 1, gpus_per_node: 4, gpu_model: V100M32, cpus_per_node: 48, memory_per_node: 368GiB}
failures: {gpu_failures_per_day: 0}
checkpoints: {interval: none}
trace_fill: {gpu_type: any}
"""


def test_the_documented_columns_become_jobs_and_cpu_only_pods_too(tmp_path: Path) -> None:
    path = tmp_path / "openb_pod_list_default.csv"
    path.write_text(PODS)
    assert detect_format(path) == "alibaba2023"
    trace = read_trace(path, load_cluster_spec(cluster_yaml(tmp_path / "c.yaml", groups=CLUSTER)), 0)
    jobs = {j.name: j for j in trace.jobs}
    assert set(jobs) == {"openb-pod-0017", "openb-pod-0022", "openb-pod-0035", "openb-pod-0061", "openb-pod-0099"}
    whole, share, typed, pending = (jobs[f"openb-pod-00{n}"] for n in ("17", "22", "35", "61"))
    assert (whole.gpus, whole.cpus, whole.mem_mb, whole.duration) == (8, 88, 327680, 10769854 - 9437497)
    assert share.gpus == pytest.approx(0.22) and share.team == "BE"
    assert typed.gpu_types == ("V100M16", "V100M32") and typed.duration == 9968575 - 9967063
    assert pending.duration == 10001403 - 10001278  # never scheduled: from its creation
    cpu_only = jobs["openb-pod-0099"]
    assert (cpu_only.gpus, cpu_only.cpus, cpu_only.mem_mb, cpu_only.gpu_types) == (0, 2, 4096, ())
    assert trace.errors == []
    nothing = tmp_path / "nothing.csv"
    nothing.write_text(HEADER + "p0,0,0,0,0,,BE,Running,0,100,0\n")
    (error,) = read_trace(nothing, load_cluster_spec(cluster_yaml(tmp_path / "c.yaml", groups=CLUSTER)), 0).errors
    assert error.line == 2 and "asks for no CPU (cpu_milli) or memory (memory_mib)" in error.message


def test_cpu_only_pods_run_on_a_cpu_only_group_and_beside_gpu_pods_in_their_own_bucket(tmp_path: Path) -> None:
    """A CPU-only group (gpus_per_node 0) beside the GPU nodes; the 8-GPU node's GPUs are all
    taken by a GPU pod. Three CPU-only pods of 20 CPUs: two fit on the 48-CPU CPU-only node at
    once, the third goes to a GPU node's CPUs (the tightest fit, the 48-CPU V100 node), holding
    no GPU. The report's figures: the GPU pod alone in the GPU jobs' times, the CPU-only pods in the
    `cpu_only` bucket and the "cpu-only" size row."""
    groups = CLUSTER.replace(
        "  - {name: v100",
        "  - {name: cpu, count: 1, gpus_per_node: 0, cpus_per_node: 48, memory_per_node: 64GiB}\n  - {name: v100",
    )
    spec = load_cluster_spec(cluster_yaml(tmp_path / "c.yaml", groups=groups))
    assert [g.gpus_per_node for g in spec.groups] == [8, 0, 4]
    rows = "g,8000,1024,8,1000,G2,LS,Succeeded,0,1000,0\n" + "".join(
        f"c{i},20000,2048,0,0,,BE,Succeeded,10,110,10\n" for i in range(3)
    )
    path = tmp_path / "pods.csv"
    path.write_text(HEADER + rows)
    trace = read_trace(path, spec, 0)
    result = Engine(spec, trace.jobs, load_policy("fifo"), 0, keep_starts=True).run()
    starts = {jid: (at, alloc) for at, jid, alloc in result.starts}
    by_name = {j.job_id: j.name for j in trace.jobs}
    cpu_nodes = sorted(alloc.slices[0].node for jid, (_, alloc) in starts.items() if by_name[jid].startswith("c"))
    assert cpu_nodes == ["cpu-0", "cpu-0", "v100-0"], starts
    assert all(at == 10 for jid, (at, _) in starts.items() if by_name[jid].startswith("c")), starts
    assert all(alloc.gpu_count == 0 for jid, (_, alloc) in starts.items() if by_name[jid].startswith("c"))
    m = run_metrics(result, spec)
    assert m["jobs"]["simulated"] == 4 and m["jct_s"]["count"] == 1 and m["jct_s"]["mean"] == 1000, m["jct_s"]
    bucket = m["cpu_only"]
    assert (bucket["jobs"], bucket["started"], bucket["succeeded"]) == (3, 3, 3), bucket
    assert bucket["queueing_delay_s"]["max"] == 0 and bucket["jct_s"]["mean"] == 100, bucket
    assert waits_by_size(result)["cpu-only"]["queueing_delay_s"]["count"] == 3


def test_pods_wait_for_cpus_a_node_has_although_its_gpus_are_free(tmp_path: Path) -> None:
    """Two 1-GPU pods of 60 CPUs each on a 96-CPU, 8-GPU node: by GPUs both fit at once, by CPUs
    the second waits for the first (the replays that left nodes over their CPUs could not)."""
    spec = load_cluster_spec(cluster_yaml(tmp_path / "c.yaml", groups=CLUSTER))
    path = tmp_path / "pods.csv"
    path.write_text(HEADER + "".join(f"p{i},60000,1024,1,1000,G2,LS,Succeeded,0,100,0\n" for i in range(2)))
    trace = read_trace(path, spec, 0)
    result = Engine(spec, trace.jobs, load_policy("fifo"), 0, keep_starts=True).run()
    starts = sorted(at for at, _, _ in result.starts)
    assert starts[0] == 0 and starts[1] >= 100
