"""The fast `decide` against the naive reference (tests/unit/reference_decide.py), the
independent oracle of issue 15: equal starts, preemptions and waits on random states, and
over random histories where each plan is carried out (starts run, victims stop and leave,
jobs end and fail back into the queue with a backoff) with the capacity and queue indexes kept
across cycles, as the head and the simulator keep them.

Seeded random (the seed is in the test id), not hypothesis: each case is a whole history, and
a failure names the seed and cycle to replay.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpucluster.core.attained import AGE_ORDER, Ordering
from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.policy import Policy, Preemption
from gpucluster.core.queue_index import QueueIndex
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, Node, NodeSlice, Plan, Priority, RunningJob

from .builders import node
from .reference_decide import RefPlan, reference_decide

CLASSES = (Priority.LOW, Priority.NORMAL, Priority.HIGH, Priority.CRITICAL)
TEAMS = ("a", "b", "c")


def _ordering(rng: random.Random) -> Ordering:
    """The default (`las`, issue 25) most often, with thresholds and slices these histories'
    minutes reach; else `las` without its preemption, or the old age order."""
    pick = rng.random()
    if pick < 0.2:
        return AGE_ORDER
    return Ordering(
        mode="las",
        queues=rng.choice([(3600.0, 8 * 3600.0), (600.0, 3000.0), (1200.0,)]),
        promote_after_s=rng.choice([None, 900.0, 7 * 86400.0]),
        preempt=pick >= 0.35,
        min_slice_s=rng.choice([0.0, 120.0, 1800.0]),
        restart_cost_s=rng.choice([0.0, 60.0]),
    )


def _policy(rng: random.Random) -> Policy:
    return Policy(
        ordering=_ordering(rng),
        fair_share=False,
        priorities=True,
        backfill=rng.random() < 0.7,
        starvation_age_s=rng.choice([600.0, 1e9]),
        default_time_limit_s=rng.choice([900.0, 3600.0]),
        preemption=Preemption(
            enabled=rng.random() < 0.8,
            grace_period_s=rng.choice([10.0, 120.0]),
            min_runtime_s=rng.choice([0.0, 60.0]),
        ),
    )


def _nodes(rng: random.Random) -> tuple[Node, ...]:
    return tuple(node(f"n{i}").gpus(8).build() for i in range(rng.randint(1, 4)))


def _job(rng: random.Random, job_id: int, now: float) -> JobRequest:
    return JobRequest(
        job_id=job_id,
        gpus=float(rng.choice([1, 1, 2, 2, 3, 4, 4, 6, 8])),
        priority=rng.choice(CLASSES[:3] if rng.random() < 0.9 else CLASSES),
        submitted_at=now - rng.uniform(0, 1200),
        team=rng.choice(TEAMS),
        time_limit_s=rng.choice([None, 300.0, 1800.0, 7200.0]),
    )


def _running(rng: random.Random, nodes: tuple[Node, ...], first_id: int, now: float) -> list[RunningJob]:
    out: list[RunningJob] = []
    for nd in nodes:
        free = list(range(len(nd.gpus)))
        while free and rng.random() < 0.75:
            k = rng.randint(1, len(free))
            idxs, free = tuple(free[:k]), free[k:]
            started = now - rng.uniform(0, 3000)
            out.append(
                RunningJob(
                    job_id=first_id + len(out),
                    allocation=Allocation((NodeSlice(nd.name, idxs),)),
                    team=rng.choice(TEAMS),
                    priority=rng.choice(CLASSES),
                    started_at=started,
                    time_limit_s=rng.choice([None, 600.0, 3600.0, 10800.0]),
                    last_checkpoint_at=started + rng.uniform(0, now - started) if rng.random() < 0.5 else None,
                    stopping=rng.random() < 0.1,
                )
            )
    return out


def _compare(fast: Plan, ref: RefPlan, where: str) -> None:
    assert [(s.job_id, s.allocation) for s in fast.starts] == list(ref.starts), f"{where}: starts"
    assert [(p.job_id, p.for_job) for p in fast.preemptions] == list(ref.preemptions), f"{where}: preemptions"
    got = {
        j: (w.reason, w.estimated_start if w.reason.value in ("reserved", "backoff", "begin") else None)
        for j, w in fast.waiting.items()
    }
    assert got == ref.waits, f"{where}: waits"


@pytest.mark.parametrize("seed", range(200))
def test_equal_plans_on_random_states(seed: int) -> None:
    rng = random.Random(seed)
    now = 100_000.0
    policy = _policy(rng)
    nodes = _nodes(rng)
    running = _running(rng, nodes, 1000, now)
    queued = []
    for i in range(rng.randint(1, 14)):
        job = _job(rng, i + 1, now)
        if rng.random() < 0.15:
            job = replace(job, not_before=now + rng.choice([-5.0, 30.0]), queued_at=now - rng.uniform(0, 900))
            if rng.random() < 0.5:  # submitted with --begin: the same hold, a wait of its own
                job = replace(job, begin=job.not_before)
        queued.append(job)
    # GPU-seconds of earlier attempts: some queued jobs ran before, some running ones too
    attained = {j.job_id: rng.uniform(0, 20_000) for j in [*queued, *running] if rng.random() < 0.4}
    snap = Snapshot(nodes, tuple(running), tuple(queued), attained=attained)
    _compare(decide(snap, policy, now), reference_decide(snap, policy, now), f"seed {seed}")


HISTORIES = range(30)
_covered: dict[str, int] = {"started": 0, "preempted": 0, "reserved": 0, "backfilled": 0, "las preempted": 0}


@pytest.mark.parametrize("seed", HISTORIES)
def test_equal_plans_over_histories_with_kept_indexes(seed: int) -> None:
    for k, v in _history(seed).items():
        _covered[k] += v


def test_the_histories_exercise_every_rule() -> None:
    """Not vacuous: over the histories, jobs started, were preempted (for class and, under the
    default `las`, for attained service by a job of the victim's own class), got reservations
    and were backfilled past one (run after the histories, in file order; alone it replays them)."""
    if not _covered["started"]:
        for seed in HISTORIES:
            for k, v in _history(seed).items():
                _covered[k] += v
    assert all(v > 10 for v in _covered.values()), _covered


def _history(seed: int) -> dict[str, int]:
    """Each cycle's plan is carried out: starts run, victims stop (their GPUs held for the grace
    period, then freed and the job requeued), jobs end by their limits or fail and come back
    after a backoff. The fast `decide` keeps a capacity and a queue index across cycles (as the
    head does), with and without `reasons`; the reference rebuilds everything each time."""
    rng = random.Random(10_000 + seed)
    policy = _policy(rng)
    nodes = _nodes(rng)
    capacity, queue_index = CapacityIndex(), QueueIndex()
    now = 50_000.0
    running: dict[int, RunningJob] = {}
    stopping_until: dict[int, float] = {}
    queued: dict[int, JobRequest] = {}
    asked: dict[int, JobRequest] = {}  # every started job's request, to requeue it
    attained: dict[int, float] = {}  # GPU-seconds of ended attempts, as the head counts them
    next_id = 1
    compared = preempted = started = reserved = backfilled = las_preempted = 0

    def ended(rj: RunningJob) -> None:
        attained[rj.job_id] = attained.get(rj.job_id, 0.0) + rj.allocation.gpu_count * (now - rj.started_at)

    for cycle in range(40):
        now += rng.choice([1.0, 15.0, 60.0, 400.0])
        for _ in range(rng.randint(0, 3)):
            queued[next_id] = replace(_job(rng, next_id, now), submitted_at=now)
            next_id += 1
        for jid, rj in list(running.items()):
            ends = rj.started_at + (rj.time_limit_s or policy.default_time_limit_s)
            if (jid in stopping_until and now >= stopping_until[jid]) or (jid not in stopping_until and now >= ends):
                del running[jid]
                if stopping_until.pop(jid, None) is not None:  # a preempted job comes back
                    ended(rj)
                    queued[jid] = replace(asked[jid], queued_at=now)
            elif jid not in stopping_until and rng.random() < 0.03:  # a failure: back after a backoff
                del running[jid]
                ended(rj)
                queued[jid] = replace(asked[jid], queued_at=now, not_before=now + 30.0)
            elif jid not in stopping_until and rng.random() < 0.3:  # it checkpoints
                running[jid] = replace(rj, last_checkpoint_at=now)
        snap = Snapshot(nodes, tuple(running.values()), tuple(queued.values()), attained=dict(attained))
        ref = reference_decide(snap, policy, now)
        fast = decide(replace(snap, capacity=capacity, queue_index=queue_index), policy, now)
        _compare(fast, ref, f"seed {seed} cycle {cycle}")
        lean = decide(snap, policy, now, reasons=False)
        assert (lean.starts, lean.preemptions) == (fast.starts, fast.preemptions), f"seed {seed} cycle {cycle}"
        compared += 1
        reserved += sum(1 for w in fast.waiting.values() if w.reason.value == "reserved")
        backfilled += any(w.reason.value == "reserved" for w in fast.waiting.values()) and bool(fast.starts)
        started += len(fast.starts)
        for p in fast.preemptions:
            las_preempted += running[p.job_id].priority == queued[p.for_job].priority
            running[p.job_id] = replace(running[p.job_id], stopping=True)
            stopping_until[p.job_id] = now + policy.preemption.grace_period_s
            preempted += 1
        for s in fast.starts:
            req = asked[s.job_id] = queued.pop(s.job_id)
            running[s.job_id] = RunningJob(s.job_id, s.allocation, req.team, req.priority, now, req.time_limit_s)
    assert compared == 40
    return {
        "started": started,
        "preempted": preempted,
        "reserved": reserved,
        "backfilled": backfilled,
        "las preempted": las_preempted,
    }
