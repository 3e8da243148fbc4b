"""Elastic shrink before preemption (issue 16, core/shrink.py): an elastic job above its minimum
gives up GPUs (it is stopped and restarts smaller at once) before jobs are stopped whole, when
`preemption.shrink_elastic` allows (the default)."""

from __future__ import annotations

from dataclasses import replace

from gpucluster.core.policy import Policy, Preemption
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.types import RunningJob
from gpucluster.waits_text import sentence

from .builders import job, node, running, snapshot

NOW = 10_000.0
PRE = Preemption(enabled=True, grace_period_s=30.0, min_runtime_s=0.0)


def _elastic(job_id: int, node_name: str, *idx: int, least: int, **kw: object) -> RunningJob:
    j = running(job_id, node_name, *idx, **kw)  # type: ignore[arg-type]
    return replace(j, min_gpus=least, max_gpus=len(idx))


def _snap(least: int) -> object:
    # The elastic job has run long (dear to stop whole); job 91 is the cheapest victim.
    return snapshot(
        nodes=[node("n1").gpus(8)],
        running=[
            _elastic(90, "n1", *range(6), least=least, priority="low", started_at=NOW - 900),
            running(91, "n1", 6, 7, priority="low", started_at=NOW - 10),
        ],
        queued=[job(1).gpus(2).priority("high")],
    )


def test_an_elastic_job_above_its_minimum_is_shrunk_rather_than_another_stopped() -> None:
    plan = decide(_snap(least=2), Policy(preemption=PRE), now=NOW)  # type: ignore[arg-type]
    assert [p.job_id for p in plan.preemptions] == [90]
    assert plan.preemptions[0].reason.startswith("resized: shrinking from 6 GPUs")
    assert "at least 2" in plan.preemptions[0].reason
    wait = plan.waiting[1]
    assert wait.reason is WaitReason.PREEMPTING and "shrinking elastic job(s) 90" in sentence(wait)


def test_the_policy_can_turn_shrinking_off() -> None:
    policy = Policy(preemption=replace(PRE, shrink_elastic=False))
    plan = decide(_snap(least=2), policy, now=NOW)  # type: ignore[arg-type]
    assert [p.job_id for p in plan.preemptions] == [91]


def test_no_shrink_when_the_elastic_job_could_not_come_back_at_its_minimum() -> None:
    # 8 GPUs: the preemptor's 2 and job 91's 2 leave 4, below the elastic job's minimum of 5.
    plan = decide(_snap(least=5), Policy(preemption=PRE), now=NOW)  # type: ignore[arg-type]
    assert [p.job_id for p in plan.preemptions] == [91]
    assert not plan.preemptions[0].reason.startswith("resized")


def test_an_elastic_job_at_its_minimum_is_a_victim_like_any_other() -> None:
    snap = snapshot(
        nodes=[node("n1").gpus(4)],
        running=[_elastic(90, "n1", 0, 1, least=2, priority="low"), running(91, "n1", 2, 3, priority="low")],
        queued=[job(1).gpus(2).priority("high")],
    )
    plan = decide(snap, Policy(preemption=PRE), now=NOW)
    assert len(plan.preemptions) == 1 and not plan.preemptions[0].reason.startswith("resized")
