"""Small builders for simulator tests: a cluster spec and a native trace written to files, and
one call that runs them and returns each job's (start, end) by id."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucluster.sim.engine import Engine, RunResult
from gpucluster.sim.readers import read_trace
from gpucluster.sim.scheduling import load_policy
from gpucluster.sim.spec import load_cluster_spec

NO_FAILURES = {"failures": {"gpu_failures_per_day": 0}, "checkpoints": {"interval": "none"}}


def cluster_yaml(
    path: Path, nodes: int = 1, gpus: int = 2, model: str = "H100-80GB", extra: str = "", groups: str | None = None
) -> Path:
    body = groups or (
        f"node_groups:\n  - {{name: n, count: {nodes}, gpus_per_node: {gpus}, gpu_model: {model}, "
        f"price_per_gpu_hour: 2.0, power_idle_w: 50, power_busy_w: 500}}\n"
    )
    path.write_text(body + extra)
    return path


def low_then_high_trace(path: Path) -> Path:
    """A trace where a high job needs a running low one's GPUs (on a node of 2): L (low, 2 GPUs,
    2 h of work) at 0, H (high, 2 GPUs, 1 h) at 30 min; H preempts L under a policy that does."""
    return native_csv(
        path,
        [
            {"submit_time": 0, "duration": "2h", "gpus": 2, "priority": "low"},
            {"submit_time": "30m", "duration": "1h", "gpus": 2, "priority": "high"},
        ],
    )


def native_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return path


@dataclass
class Ran:
    result: RunResult
    start: dict[int, float]
    end: dict[int, float]
    outcome: dict[int, int]


def run(cluster: Path, trace: Path, policy: str = "fifo", seed: int = 0, fmt: str | None = None) -> Ran:
    spec = load_cluster_spec(cluster)
    tr = read_trace(trace, spec, seed, fmt)
    res = Engine(spec, tr.jobs, load_policy(policy), seed).run()
    ids = list(res.job_id)
    return Ran(
        result=res,
        start=dict(zip(ids, res.first_start, strict=True)),
        end=dict(zip(ids, res.end, strict=True)),
        outcome=dict(zip(ids, res.outcome, strict=True)),
    )
