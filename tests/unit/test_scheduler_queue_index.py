"""The queue index kept across cycles hands `decide` the very lines a fresh sort gives.

Seeded random histories of queues (jobs arriving, starting, requeued with a queue entry time,
held back after a failure, replaced by another object, some aged) against random policies: after
each update the index's lines equal `sort_in_plain` of the same queue, its bounds equal the ones
`decide` works out without it, and plans made through it (full and plan-only) equal plans made
without it, with the capacity index kept as well, as the simulator does.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.policy import Policy, Preemption, fifo_policy, priority_policy
from gpucluster.core.queue_index import QueueIndex
from gpucluster.core.queueing import TeamQueues, sort_in, sort_in_plain
from gpucluster.core.scheduler import _Cycle, decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, Priority, RunningJob

from .builders import policy as build_policy
from .builders import preemption, team
from .guaranteed_split import split_guaranteed
from .test_scheduler_index import _nodes

POLICIES = {
    "default": Policy(preemption=Preemption(grace_period_s=5.0), starvation_age_s=200.0),
    "fifo": fifo_policy(),
    "priority": priority_policy(),
    "no-fair-share": Policy(fair_share=False, starvation_age_s=100.0),
    # Quotas: the cycle splits the index's lines by guarantee (core/split_kept.py).
    "quotas": build_policy(
        team("a", quota={"H100": 6, "A100": 2}),
        team("b", quota={"A100": 8}),
        team("c"),
        preemption=preemption(grace_period_s=5.0, reclaim_quota=True),
        starvation_age_s=200.0,
    ),
}


def _job(rng: random.Random, job_id: int, now: float) -> JobRequest:
    gpus = rng.choice([0.5, 1, 1, 1, 2, 4, 8, 12])
    return JobRequest(
        job_id,
        float(gpus),
        gpu_types=rng.choice([(), ("H100",), ("A100", "H100")]),
        priority=Priority(rng.choice([0, 1, 1, 2])),
        submitted_at=now - rng.choice([0.0, 0.0, rng.uniform(0, 300)]),
        team=rng.choice(["a", "b", "c"]),
        time_limit_s=rng.choice([None, 0.0, 60.0, 600.0]),
        gpu_memory_mb=rng.choice([None, None, None, None, None, 8192]),
        min_gpus=rng.choice([None, None, None, 1]) if gpus >= 2 else None,
    )


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_queue_index_gives_fresh_lines_and_plans_over_a_history(name: str, seed: int) -> None:
    rng = random.Random(seed)
    policy = POLICIES[name]
    index, capacity = QueueIndex(), CapacityIndex()
    nodes = _nodes(4)
    running: dict[int, RunningJob] = {}
    queued: dict[int, JobRequest] = {}
    next_id = 1
    for cycle in range(60):
        now = cycle * 10.0
        for _ in range(rng.randrange(0, 10)):
            queued[next_id] = _job(rng, next_id, now)
            next_id += 1
        for job_id in [j for j in running if rng.random() < 0.15]:
            job = running.pop(job_id)
            if rng.random() < 0.3:  # requeued: a new object, with when it re-entered, maybe held back
                held = now + rng.choice([-5.0, 30.0]) if rng.random() < 0.5 else None
                queued[job_id] = _job(rng, job_id, job.started_at)
                queued[job_id] = replace(queued[job_id], queued_at=now, not_before=held)
        for job_id in [j for j in queued if rng.random() < 0.05]:
            queued[job_id] = replace(queued[job_id])  # the same job, another object
        snap = Snapshot(nodes, tuple(running.values()), tuple(rng.sample(list(queued.values()), len(queued))))
        index.update(snap.queued, policy)
        assert index.sorted_in(policy, now) == sort_in_plain(snap.queued, policy, now), f"cycle {cycle}"
        assert index.least_asked(policy.default_time_limit_s) == _Cycle(snap, policy, now)._least_asked()
        fresh = decide(snap, policy, now)
        kept = decide(replace(snap, queue_index=index, capacity=capacity), policy, now)
        assert kept == fresh, f"cycle {cycle}"
        fast = decide(replace(snap, queue_index=index, capacity=capacity), policy, now, reasons=False)
        assert (fast.starts, fast.preemptions) == (fresh.starts, fresh.preemptions), f"cycle {cycle}"
        for p in fresh.preemptions:
            running[p.job_id] = replace(running[p.job_id], stopping=True)
        for st in fresh.starts:
            req = queued.pop(st.job_id)
            running[st.job_id] = RunningJob(st.job_id, st.allocation, req.team, req.priority, now, req.time_limit_s)
    assert index.rebuilds == 1
    assert running, "the history never started anything: it tests nothing"


def test_a_change_of_classes_rebuilds_the_lines() -> None:
    index = QueueIndex()
    queue = tuple(_job(random.Random(k), k, 0.0) for k in range(1, 30))
    for policy in (Policy(), fifo_policy(), Policy()):
        index.update(queue, policy)
        assert index.sorted_in(policy, 50.0) == sort_in_plain(queue, policy, 50.0)
    assert index.rebuilds == 3


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("honest", [True, False])
def test_a_told_index_gives_fresh_lines_and_plans_over_a_history(name: str, seed: int, honest: bool) -> None:
    """The simulator's way (`QueueIndex(told=True)`): it reports each job entering and leaving
    its queue, in order, as it happens. A caller that forgets one report between two cycles now
    and then (`honest` False) still gets fresh lines: the count check sends the update to the
    full diff. (Two forgotten reports can cancel out in the count: the check is a guard, not a
    proof; the simulator's reports are its two queue changes, `Engine._enqueue` and `_start`.)"""
    rng = random.Random(seed)
    policy = POLICIES[name]
    index, capacity = QueueIndex(told=True), CapacityIndex()
    nodes = _nodes(4)
    running: dict[int, RunningJob] = {}
    queued: dict[int, JobRequest] = {}
    forgot = [False]  # a report forgotten since the last cycle

    def report() -> bool:
        if honest or forgot[0] or rng.random() > 0.05:
            return True
        forgot[0] = True
        return False

    def enter(job: JobRequest) -> None:
        old = queued.get(job.job_id)
        if old is not None:
            leave(old)
        queued[job.job_id] = job
        if report():
            index.add(job)

    def leave(job: JobRequest) -> None:
        del queued[job.job_id]
        if report():
            index.remove(job)

    next_id = 1
    for cycle in range(60):
        now = cycle * 10.0
        for _ in range(rng.randrange(0, 10)):
            enter(_job(rng, next_id, now))
            next_id += 1
        for job_id in [j for j in running if rng.random() < 0.15]:
            job = running.pop(job_id)
            if rng.random() < 0.3:  # requeued: a new object, with when it re-entered, maybe held back
                held = now + rng.choice([-5.0, 30.0]) if rng.random() < 0.5 else None
                enter(replace(_job(rng, job_id, job.started_at), queued_at=now, not_before=held))
        for job_id in [j for j in queued if rng.random() < 0.05]:
            enter(replace(queued[job_id]))  # the same job, another object
        if rng.random() < 0.1:
            continue  # no cycle this time: the reports pile up until the next one
        snap = Snapshot(nodes, tuple(running.values()), tuple(queued.values()))
        forgot[0] = False
        fresh = decide(snap, policy, now)
        # (Without the capacity index when reports are forgotten: that history reaches a GPU
        # shared by 0.2s, where the capacity index's float sums differ; see test_scheduler_index.)
        kept = capacity if honest else None
        fast = decide(replace(snap, queue_index=index, capacity=kept), policy, now, reasons=False)
        assert (fast.starts, fast.preemptions) == (fresh.starts, fresh.preemptions), f"cycle {cycle}"
        assert index.sorted_in(policy, now) == sort_in_plain(snap.queued, policy, now), f"cycle {cycle}"
        assert index.least_asked(policy.default_time_limit_s) == _Cycle(snap, policy, now)._least_asked()
        for p in fresh.preemptions:
            running[p.job_id] = replace(running[p.job_id], stopping=True)
        for st in fresh.starts:
            req = queued[st.job_id]
            leave(req)
            running[st.job_id] = RunningJob(st.job_id, st.allocation, req.team, req.priority, now, req.time_limit_s)
    assert running, "the history never started anything: it tests nothing"
    if honest:
        assert index.diffs == 1  # the first update only: every other one applied the reports


def test_kept_odd_jobs_follow_every_flip_of_held_and_aged() -> None:
    """Requeued and held-back jobs are sorted in once and kept while none of them changes state
    (`QueueIndex._odd_in`): asked at each flip's very time and just either side of it, and then
    back in time, the lines must equal a fresh sort."""
    policy = Policy(starvation_age_s=100.0)
    rng = random.Random(7)
    base = 1_700_000_000.0  # epoch-sized times: the rounding of `now - queued_at` is coarsest here
    queue = []
    for k in range(1, 40):
        job = _job(rng, k, base)
        entered = base + rng.choice([0.0, 0.1, 33.3, 70.0])
        held = base + rng.choice([50.0, 120.5]) if k % 3 == 0 else None
        queue.append(replace(job, queued_at=entered if k % 2 else None, not_before=held))
    index = QueueIndex(told=True)
    for job in queue:
        index.add(job)
    index.update(tuple(queue), policy)
    flips = sorted(
        {t for j in queue for t in (j.not_before, (j.queued_at or j.submitted_at) + policy.starvation_age_s) if t}
    )
    times = [t + d for t in flips for d in (-1e-3, -2.5e-7, 0.0, 2.5e-7, 1e-3)]
    for now in [*times, *reversed(times)]:
        assert index.sorted_in(policy, now) == sort_in_plain(tuple(queue), policy, now), now


def _told_queue(policy: Policy, seed: int, plain: int, requeued_at: float) -> tuple[list[JobRequest], QueueIndex]:
    """`plain - 1` jobs submitted up to 300 s before 0, and ten requeued at `requeued_at` (odd),
    in a told index brought up to them."""
    rng = random.Random(seed)
    queue = [_job(rng, k, 0.0) for k in range(1, plain)]
    queue += [replace(_job(rng, k, 0.0), queued_at=requeued_at) for k in range(plain, plain + 10)]
    index = QueueIndex(told=True)
    for job in queue:
        index.add(job)
    index.update(tuple(queue), policy)
    return queue, index


def test_lines_no_change_reached_are_handed_out_again_not_copied() -> None:
    """Between two cycles a job or two come or go; the other lines, the aged jobs among them,
    are the lists the last cycle got (`QueueIndex._part`), and a changed line is made afresh:
    each equal to a fresh sort. Before, every line was copied (and requeued jobs merged into it
    again) each cycle."""
    policy = Policy(starvation_age_s=100.0)
    queue, index = _told_queue(policy, 3, 200, -50.0)
    _, aged, lines = index.sorted_in(policy, 0.0)
    assert aged and lines
    again = index.sorted_in(policy, 0.0)
    assert again[1] is aged
    assert all(again[2][level][team] is jobs for level, per in lines.items() for team, jobs in per.items())
    gone = next(j for j in queue if j.queued_at is None and -j.submitted_at < 100.0)
    index.remove(gone)
    queue.remove(gone)
    index.update(tuple(queue), policy)
    after = index.sorted_in(policy, 0.0)
    assert after == sort_in_plain(tuple(queue), policy, 0.0)
    assert after[1] is aged  # no aged job left
    changed = (int(gone.priority) if policy.priorities else 0, gone.team)
    assert after[2][changed[0]][changed[1]] is not lines[changed[0]][changed[1]]
    assert any(after[2][level][team] is jobs for level, per in lines.items() for team, jobs in per.items())


def test_a_cycle_cuts_only_the_lines_of_the_levels_its_walk_reaches(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sorted_lazily`: the aged jobs at once, a level's lines only once `TeamQueues` enters
    it (about a third of whole Philly's cycles consider an aged job and stop), and the order
    handed out is the one `sorted_in`'s lines give."""
    policy = Policy(starvation_age_s=100.0)
    queue, index = _told_queue(policy, 5, 120, -30.0)
    cut: list[int] = []
    young = QueueIndex._young
    monkeypatch.setattr(QueueIndex, "_young", lambda self, level, *a: cut.append(level) or young(self, level, *a))
    held, aged, lines = index.sorted_lazily(policy, 0.0)
    assert aged and len(lines) == 3 and not cut
    lazy = TeamQueues(queue, policy, {}, 0.0, presorted=(held, aged, lines))
    eager = TeamQueues(queue, policy, {}, 0.0, presorted=index.sorted_in(policy, 0.0))
    cut.clear()
    for k in range(len(queue) + 1):
        if k == len(aged):
            assert cut == []  # only aged jobs handed out yet
        if k == len(aged) + 1:
            assert cut == [2]  # the highest class's lines, no other
        job, want = lazy.pop(), eager.pop()
        assert job is want
        if job is None:
            break
        lazy.done(job, False)
        eager.done(job, False)
    assert cut == [2, 1, 0]


@pytest.mark.parametrize("told", [True, False])
def test_many_jobs_entering_at_once_are_sorted_in_as_one_by_one(told: bool) -> None:
    """A head's first plan after a start tells its index every queued job at once
    (`ClusterState.build`); an untold index's first update diffs them all in. Past a few, each
    sorted list takes them by one sort (`_ByAge.add_all`), not one insertion each (quadratic:
    3.2 CPU-s at 100,000 queued). The lines must be those of a fresh sort: after the first
    batch, after a second batch into the same lines (older jobs too, ahead of the aged part the
    first cycle kept), and after a few more entered one by one."""
    policy = Policy(starvation_age_s=100.0)
    rng = random.Random(5)
    index = QueueIndex(told=told)
    queue: list[JobRequest] = []

    def cycle(new: list[JobRequest], now: float) -> None:
        queue.extend(new)
        for job in new:
            index.add(job)
        index.update(tuple(queue), policy)
        assert index.sorted_in(policy, now) == sort_in_plain(tuple(queue), policy, now)

    first = [_job(rng, k, 0.0) for k in range(1, 400)]
    first += [replace(_job(rng, k, 0.0), queued_at=-50.0) for k in range(400, 420)]  # odd: requeued
    first += [replace(_job(rng, k, 0.0), submitted_at=-150.0) for k in range(420, 440)]  # equal ages
    cycle(first, 0.0)
    assert index.diffs == 1  # the first update builds from the queue, told or not
    cycle([_job(rng, k, rng.choice([-400.0, -400.0, 0.0])) for k in range(440, 1000)], 10.0)
    cycle([_job(rng, k, 10.0) for k in range(1000, 1003)], 20.0)
    assert index.diffs == (1 if told else 3)  # a told index applied the later batches as told


def test_a_batch_into_the_aged_part_is_seen_when_its_length_is_the_same() -> None:
    """A batch of old jobs that lands in the aged part, asked at an earlier time at which the
    aged part is as long as the one the index kept (the index answers for any `now`, back in
    time too): the kept list must not be handed out (`_ByAge.add_all` marks the change)."""
    policy = Policy(starvation_age_s=100.0)
    queue = [JobRequest(i, 1.0, submitted_at=-float(i), team="a") for i in range(1, 401)]
    index = QueueIndex(told=True)
    for job in queue:
        index.add(job)
    index.update(tuple(queue), policy)
    assert len(index.sorted_in(policy, 0.0)[1]) == 301
    old = [JobRequest(i, 1.0, submitted_at=-10_000.0, team="a") for i in range(1000, 1200)]
    queue += old
    for job in old:
        index.add(job)
    index.update(tuple(queue), policy)
    got = index.sorted_in(policy, -200.0)
    assert len(got[1]) == 301  # 101 of the first jobs and the 200 old ones
    assert got == sort_in_plain(tuple(queue), policy, -200.0)


@pytest.mark.parametrize("seed", range(6))
def test_the_index_lines_split_by_guarantee_are_sort_ins(seed: int) -> None:
    """`split_guaranteed` of `sort_in_plain`'s lists (the index's) is `sort_in` with the same
    guarantee: each job within its team's quota a level above every class, every line by age
    (a guarantee that depends on a job's team and shape, as `_Cycle._guaranteed`'s does;
    asked once per distinct request)."""
    rng = random.Random(seed)
    pol = POLICIES["quotas"]
    now = 400.0
    queue = [_job(rng, k, now) for k in range(1, 120)]
    for k in rng.sample(range(len(queue)), 20):  # requeued, some held back, some aged
        queue[k] = replace(queue[k], queued_at=now - rng.choice([5.0, 350.0]), not_before=rng.choice([None, now + 9]))
    within = {(t, g): rng.random() < 0.5 for t in "abc" for g in (0.5, 1.0, 2.0, 4.0, 8.0, 12.0)}
    asked: list[int] = []

    def guaranteed(job: JobRequest) -> bool:
        asked.append(job.job_id)
        return within[(job.team, job.gpus)]

    want = sort_in(queue, pol, now, guaranteed)
    asked.clear()
    got = split_guaranteed(sort_in_plain(queue, pol, now), guaranteed)
    assert got == want
    assert {lvl for lvl in got[2] if lvl >= 10} and {lvl for lvl in got[2] if lvl < 10}  # both kinds
    by_id = {j.job_id: j for j in queue}
    assert asked and len(asked) == len({by_id[j].demand for j in asked})  # once per distinct request
