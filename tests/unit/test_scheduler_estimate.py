"""Estimated starts for every queued job (core/estimate.py), rule by rule.

Each row: a cluster, running jobs, the waiting jobs in scheduling order (as a plan lists them)
and the start each is expected to get. Times are seconds from now = 0; the default policy
gives jobs without a limit 3600 s and a 30 s grace period.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpucluster.core.estimate import Estimate, estimate_starts
from gpucluster.core.policy import Policy
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, Node, Plan, Preemption, RunningJob, Wait
from tests.unit.builders import job, node, running, spread

H8 = node("h1").gpus(8, "H100").build()


@dataclass
class Case:
    name: str
    nodes: list[Node]
    queued: list[JobRequest]
    expect: dict[int, float | None]
    running: list[RunningJob] = field(default_factory=list)
    reasons: dict[int, WaitReason] = field(default_factory=dict)  # default: RESOURCES
    preempted: list[int] = field(default_factory=list)
    exact_limit: int = 100


CASES = [
    Case("free now (held by quota, say): now", [H8], [job(1).build()], {1: 0.0}),
    Case(
        "busy GPUs: when the running job's limit ends",
        [H8],
        [job(1).gpus(8).build()],
        {1: 100.0},
        running=[running(50, "h1", *range(8), limit=100.0)],
    ),
    Case(
        "no limit: the policy default (3600 s)",
        [H8],
        [job(1).gpus(8).build()],
        {1: 3600.0},
        running=[running(50, "h1", *range(8))],
    ),
    Case(
        "in line: each after the one before it",
        [H8],
        [job(1).gpus(8).limit(50).build(), job(2).gpus(8).limit(50).build(), job(3).gpus(8).build()],
        {1: 100.0, 2: 150.0, 3: 200.0},
        running=[running(50, "h1", *range(8), limit=100.0)],
    ),
    Case(
        "backfill: a short job fits in the gap before a reservation, a long one waits",
        [H8],
        [job(1).gpus(8).limit(100).build(), job(2).gpus(2).limit(50).build(), job(3).gpus(2).limit(200).build()],
        {1: 100.0, 2: 0.0, 3: 200.0},
        running=[running(50, "h1", 0, 1, 2, 3, limit=100.0)],
    ),
    Case(
        "the model that frees first, whatever the preference",
        [H8, node("a1").gpus(8, "A100").build()],
        [job(1).gpu_types("H100", "A100").build()],
        {1: 0.0},
        running=[running(50, "h1", *range(8), limit=100.0)],
    ),
    Case(
        "a preempted job frees its GPUs after the grace period",
        [H8],
        [job(1).gpus(8).priority("high").build()],
        {1: 30.0},
        running=[running(50, "h1", *range(8), priority="low", limit=1000.0)],
        reasons={1: WaitReason.PREEMPTING},
        preempted=[50],
    ),
    Case(
        "a stopping job frees its GPUs after the grace period",
        [H8],
        [job(1).gpus(8).build()],
        {1: 30.0},
        running=[running(50, "h1", *range(8), limit=1000.0, stopping=True)],
    ),
    Case(
        "multi-node: when the last of its nodes frees",
        [H8, node("h2").gpus(8, "H100").build()],
        [job(1).gpus(16).build()],
        {1: 100.0},
        running=[running(50, "h2", 0, limit=100.0)],
    ),
    Case(
        "exact node count: the fewest-busy nodes",
        [H8, node("h2").gpus(8, "H100").build(), node("h3").gpus(8, "H100").build()],
        [job(1).gpus(16).nodes(2).build()],
        {1: 40.0},
        running=[spread(50, {"h1": [0], "h2": [0]}, limit=40.0), running(51, "h3", 0, limit=500.0)],
    ),
    Case(
        "never fits: no estimate",
        [H8],
        [job(1).gpus(64).gpu_type("H100").build()],
        {1: None},
        reasons={1: WaitReason.NO_FIT},
    ),
    Case(
        "a fraction waits for a whole GPU (counted as one)",
        [H8],
        [job(1).gpus(0.5).build()],
        {1: 100.0},
        running=[running(50, "h1", *range(8), limit=100.0)],
    ),
]


def _plan(case: Case) -> Plan:
    waiting = {q.job_id: Wait(case.reasons.get(q.job_id, WaitReason.RESOURCES)) for q in case.queued}
    return Plan(preemptions=tuple(Preemption(v, 0, "test") for v in case.preempted), waiting=waiting)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_estimate_rule(case: Case) -> None:
    snap = Snapshot(tuple(case.nodes), tuple(case.running), tuple(case.queued))
    got = estimate_starts(snap, Policy(), 0.0, _plan(case), limit=case.exact_limit)
    assert {k: e.start for k, e in got.items()} == case.expect
    assert all(e.exact for e in got.values())


def test_past_the_replayed_part_a_lower_bound_is_given() -> None:
    queued = [job(i).gpus(8).limit(50).build() for i in (1, 2, 3)]
    snap = Snapshot((H8,), (running(50, "h1", *range(8), limit=100.0),), tuple(queued))
    plan = Plan(waiting={q.job_id: Wait(WaitReason.RESOURCES) for q in queued})
    got = estimate_starts(snap, Policy(), 0.0, plan, limit=1)
    assert got[1] == Estimate(100.0)
    # After job 1's reservation the node is free from 150: jobs 2 and 3 start no earlier.
    assert got[2] == Estimate(150.0, exact=False) and got[3] == Estimate(150.0, exact=False)


def test_backoff_and_reservation_estimates_are_respected() -> None:
    held = JobRequest(1, 1.0, not_before=500.0)
    snap = Snapshot((H8,), (), (held,))
    plan = Plan(waiting={1: Wait(WaitReason.BACKOFF, estimated_start=500.0)})
    assert estimate_starts(snap, Policy(), 0.0, plan)[1] == Estimate(500.0)


def test_every_job_in_a_real_plan_gets_an_estimate_in_order() -> None:
    """Through `decide`: the first job in line is reserved; the 2nd and 3rd get later starts."""
    queued = [job(i).gpus(8).limit(600).build() for i in (1, 2, 3)]
    snap = Snapshot((H8,), (running(50, "h1", *range(8), limit=100.0),), tuple(queued))
    plan = decide(snap, Policy(), 0.0)
    assert list(plan.waiting) == [1, 2, 3]
    got = estimate_starts(snap, Policy(), 0.0, plan)
    assert plan.waiting[1].estimated_start == got[1].start == 100.0
    assert [got[i].start for i in (2, 3)] == [700.0, 1300.0]


def test_estimates_do_not_double_book() -> None:
    """Many one-GPU jobs on a busy node: never more than 8 reserved at any moment."""
    queued = [job(i).limit(float(10 * (i % 7 + 1))).build() for i in range(1, 60)]
    snap = Snapshot((H8,), (running(50, "h1", 0, 1, 2, limit=25.0),), tuple(queued))
    plan = Plan(waiting={q.job_id: Wait(WaitReason.RESOURCES) for q in queued})
    got = estimate_starts(snap, Policy(), 0.0, plan)
    intervals = [(0.0, 25.0)] * 3 + [
        (got[q.job_id].start or 0.0, (got[q.job_id].start or 0.0) + (q.time_limit_s or 0)) for q in queued
    ]
    for t in sorted({a for a, _ in intervals}):
        assert sum(1 for a, b in intervals if a <= t < b) <= 8, t
