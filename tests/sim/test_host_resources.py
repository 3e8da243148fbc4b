"""CPUs and host memory in the simulator (issue 16): the cluster spec declares them per node
group, native traces carry `cpus`/`mem`, rows without them get the policy's `resources:` per
GPU, and the core's placement never runs more than a node holds."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from gpucluster.sim.engine import Engine
from gpucluster.sim.readers import read_trace
from gpucluster.sim.scheduling import load_policy
from gpucluster.sim.spec import load_cluster_spec
from tests.sim.helpers import cluster_yaml, native_csv

GROUPS = """node_groups:
  - {name: small, count: 2, gpus_per_node: 8, gpu_model: H100, cpus_per_node: 4, memory_per_node: 16GiB}
failures: {gpu_failures_per_day: 0}
checkpoints: {interval: none}
"""


def _overlap_peak(res: object, trace_jobs: list[object], field: str) -> dict[str, float]:
    """Per node, the most of `field` (per-slice) held at one time."""
    ends = dict(zip(res.job_id, res.end, strict=True))  # type: ignore[attr-defined]
    events: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for at, job_id, alloc in res.starts:  # type: ignore[attr-defined]
        for s in alloc.slices:
            amount = float(getattr(s, field))
            events[s.node] += [(at, amount), (ends[job_id], -amount)]
    peak: dict[str, float] = {}
    for node, evs in events.items():
        level = top = 0.0
        for _, d in sorted(evs, key=lambda e: (e[0], e[1])):  # ends before starts at one instant
            level += d
            top = max(top, level)
        peak[node] = top
    return peak


def test_jobs_never_hold_more_cpus_or_memory_than_a_node_has(tmp_path: Path) -> None:
    spec = load_cluster_spec(cluster_yaml(tmp_path / "c.yaml", groups=GROUPS))
    assert {(n.cpus, n.memory_mb) for n, _ in spec.nodes()} == {(4, 16384)}
    rows = [{"submit_time": 0, "duration": 100, "gpus": 1, "cpus": 3 if i % 2 else 1.5, "mem": "6G"} for i in range(8)]
    trace = read_trace(native_csv(tmp_path / "t.csv", rows), spec, 0, "native")
    res = Engine(spec, trace.jobs, load_policy("fifo"), 0, keep_starts=True).run()
    assert len(res.job_id) == 8
    assert max(_overlap_peak(res, trace.jobs, "cpus").values()) <= 4 + 1e-9
    assert max(_overlap_peak(res, trace.jobs, "host_memory_mb").values()) <= 16384
    # By GPUs all 8 would start at once on 16 GPUs; by CPUs and memory only two per node can.
    assert max(res.end) >= 200


def test_rows_without_cpus_take_the_policy_default(tmp_path: Path) -> None:
    spec = load_cluster_spec(cluster_yaml(tmp_path / "c.yaml", groups=GROUPS))
    policy = tmp_path / "p.yaml"
    policy.write_text("resources: {cpus_per_gpu: 2}\n")
    rows = [{"submit_time": 0, "duration": 100, "gpus": 1} for _ in range(8)]
    trace = read_trace(native_csv(tmp_path / "t.csv", rows), spec, 0, "native")
    res = Engine(spec, trace.jobs, load_policy(str(policy)), 0, keep_starts=True).run()
    assert {s.cpus for _, _, a in res.starts for s in a.slices} == {2}
    assert max(_overlap_peak(res, trace.jobs, "cpus").values()) <= 4 + 1e-9
    assert max(res.end) >= 200  # two 2-CPU jobs per 4-CPU node at a time
