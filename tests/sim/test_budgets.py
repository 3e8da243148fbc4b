"""Budgets in the simulator (issue 15): a policy file's `budgets:` holds a team once it has spent
its budget for the period, as the head's accountant does, through the core's admission
(Snapshot.holds); the run's metrics say what each team spent and how long it was held."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.core.admission import admit
from gpucluster.core.policy import Policy
from gpucluster.core.reasons import WaitFacts, WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, Priority
from gpucluster.sim.engine import FAILED_BUDGET, SUCCEEDED, Engine, RunResult
from gpucluster.sim.metrics import run_metrics
from gpucluster.sim.scheduling import load_policy
from gpucluster.sim.spec import ClusterSpec, load_cluster_spec
from gpucluster.sim.workload import TraceJob
from gpucluster.waits_text import sentence
from tests.sim.helpers import cluster_yaml
from tests.unit.builders import node

DAY = 86400.0


def _job(job_id: int, submit: float, team: str, gpus: int = 1, hours: float = 1.0) -> TraceJob:
    return TraceJob(
        job_id=job_id,
        submit=submit,
        duration=hours * 3600.0,
        gpus=gpus,
        team=team,
        priority=Priority.NORMAL,
        gpu_types=(),
        name=f"j{job_id}",
        line=job_id,
        time_limit=None,
        checkpoint=None,
    )


def _run(tmp: Path, budgets: str, jobs: list[TraceJob]) -> tuple[RunResult, ClusterSpec]:
    (tmp / "policy.yaml").write_text("priorities: true\nfair_share: {enabled: false}\n" + budgets)
    spec = load_cluster_spec(
        cluster_yaml(tmp / "c.yaml", nodes=1, gpus=8, extra="failures: {gpu_failures_per_day: 0}\n")
    )
    return Engine(spec, jobs, load_policy(str(tmp / "policy.yaml")), 0, keep_starts=True).run(), spec


def _starts(res: RunResult) -> dict[int, float]:
    return {job_id: t for t, job_id, _ in res.starts}


def test_a_team_over_its_gpu_hours_is_held_until_the_period_rolls_over(tmp_path: Path) -> None:
    """Team a may use 2 GPU-hours a day: four 1-GPU jobs, and a fifth from 600 s, cross it at
    1560 s (0.67 GPU-hours by 600 s, then 5 GPUs for 960 s), so its job submitted after that
    waits for the next day; team b, without a budget, is never held."""
    jobs = [_job(i, 0.0, "a") for i in (1, 2, 3, 4)] + [_job(5, 600.0, "a"), _job(6, 2000.0, "a")]
    jobs.append(_job(7, 2400.0, "b"))
    res, spec = _run(tmp_path, "budgets:\n  a: {period: 1d, gpu_hours: 2}\n", jobs)
    starts = _starts(res)
    assert [starts[i] for i in (1, 2, 3, 4)] == [0.0] * 4  # all start: the budget is not spent yet
    assert starts[5] == 600.0  # 0.67 GPU-hours spent by then
    assert starts[6] == DAY  # held from 1560 s (2 GPU-hours spent), released when the day rolls over
    assert starts[7] == 2400.0  # another team is not held
    assert set(res.outcome) == {SUCCEEDED}  # `finish`: running jobs run to their end
    got = run_metrics(res, spec)["budgets"]
    assert got == {
        "a": {
            "spent_money": pytest.approx(2.0 * 6),  # 6 GPU-hours at the spec's 2.0 per GPU-hour
            "spent_gpu_hours": pytest.approx(6.0),
            "held_hours": pytest.approx((DAY - 1560.0) / 3600.0, abs=0.01),
            "holds": 1,
            "stopped_jobs": 0,
        }
    }


def test_a_budget_that_stops_fails_the_teams_running_jobs_by_policy(tmp_path: Path) -> None:
    jobs = [_job(1, 0.0, "a", gpus=2), _job(2, 0.0, "b", gpus=2)]
    res, spec = _run(tmp_path, "budgets:\n  a: {period: 1d, money: 1, on_exceed: stop}\n", jobs)
    outcome = dict(zip(res.job_id, res.outcome, strict=True))
    end = dict(zip(res.job_id, res.end, strict=True))
    assert outcome == {1: FAILED_BUDGET, 2: SUCCEEDED}
    assert end[1] == pytest.approx(900.0)  # 2 GPUs at 2.0 per GPU-hour spend 1.0 in 15 minutes
    metrics = run_metrics(res, spec)
    assert metrics["jobs"]["failed_budget_stop"] == 1
    assert metrics["budgets"]["a"]["stopped_jobs"] == 1


def test_without_budgets_nothing_changes(tmp_path: Path) -> None:
    jobs = [_job(i, 10.0 * i, "a", gpus=4) for i in range(1, 7)]
    plain, _ = _run(tmp_path, "", jobs)
    unlimited, _ = _run(tmp_path, "budgets:\n  a: {period: 1d, gpu_hours: 1000}\n", jobs)
    assert plain.starts == unlimited.starts and list(plain.end) == list(unlimited.end)


def test_decide_admits_drained_nodes_and_held_teams() -> None:
    """Drains and holds are inputs of decide: no new job on a drained node, a held team's jobs
    wait with the hold's reason, the others plan as without them."""
    nodes = (node("n1").gpus(4).build(), node("n2").gpus(4).build())
    queued = (
        JobRequest(1, 4.0, team="a", priority=Priority.NORMAL, submitted_at=0.0),
        JobRequest(2, 4.0, team="b", priority=Priority.NORMAL, submitted_at=1.0),
        JobRequest(3, 4.0, team="b", priority=Priority.NORMAL, submitted_at=2.0),
    )
    hold = WaitFacts(team="a", money=5.0, money_limit=5.0, period="1d", until=86400.0)
    snap = Snapshot(nodes, (), queued, drained=frozenset({"n1"}), holds={"a": hold})
    plan = decide(snap, Policy(), 10.0)
    assert [(s.job_id, s.allocation.slices[0].node) for s in plan.starts] == [(2, "n2")]
    assert plan.waiting[1].reason is WaitReason.BUDGET and plan.waiting[1].facts == hold
    assert sentence(plan.waiting[1]) == (
        "held: team a spent 5.00 of its 5 money budget for this 1d period; "
        "released when the period rolls over (1970-01-02 00:00 UTC) or the budget grows"
    )
    assert plan.waiting[3].reason is not WaitReason.BUDGET
    admitted, held = admit(snap)
    assert [n.name for n in admitted.nodes] == ["n2"] and [j.job_id for j in admitted.queued] == [2, 3]
    assert set(held) == {1} and not admitted.drained and not admitted.holds
    plain = decide(Snapshot(nodes[1:], (), queued[1:]), Policy(), 10.0)
    assert plan.starts == plain.starts
