"""Predictions never cost the reserved job its guarantee (issue 24).

Run-time predictions (core/runtime_predict.py) go into the estimates; `decide`'s backfill
reservations stay bounded by time limits. Property: on random clusters and queues (jobs asking
for CPUs and host memory too, the head-of-line job possibly short of them alone), with every
job really running some time up to its limit and predictions that may be wildly wrong (far
shorter than the real run), cycles of `decide` with the prediction-based estimates computed each
cycle (as the head does) never start the head-of-line job later than the reservation it was
first given from time limits; and the estimates never change a plan. With `gang` there are two
nodes and the head-of-line job is a `--nodes 2` gang, needing its GPUs on each of them."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpucluster.core.estimate import estimate_starts
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import JobRequest, RunningJob
from tests.unit.builders import job, no_preemption, node, policy, running

POLICY = policy(preemption=no_preemption())
GPUS = 8


CPUS, MEM = 16.0, 64 * 1024  # the node's host resources, when a scenario accounts them

Case = tuple[list[RunningJob], list[JobRequest], dict[int, float], dict[int, float], bool, bool]


@st.composite
def scenario(draw: st.DrawFn) -> Case:
    """Running jobs filling some of one 8-GPU node, a head-of-line job that cannot start now,
    and small jobs behind it; each job's real run time (<= its limit) and its prediction.
    With `host` the node has 16 CPUs and 64 GiB that jobs ask for too, and the head-of-line
    job may be short of CPUs or memory alone (its GPUs free): the same guarantee holds. With
    `gang`, node h2 is filled the same way and the head-of-line job asks for `per` GPUs on each
    of both nodes, more than one of them has free (short of GPUs only)."""
    host = draw(st.booleans())
    gang = draw(st.booleans())
    actual: dict[int, float] = {}
    predicted: dict[int, float] = {}
    held: list[RunningJob] = []
    job_id = 1
    frees: list[int] = []
    for name in ("h1", "h2") if gang else ("h1",):
        gpu = 0
        cpus_used, mem_used = 0.0, 0
        while gpu < GPUS and (gpu < 2 or draw(st.booleans())):
            n = draw(st.integers(1, min(4, GPUS - gpu)))
            limit = float(draw(st.integers(10, 200)))
            r = running(job_id, name, *range(gpu, gpu + n), limit=limit, started_at=0.0)
            if host:
                c = draw(st.sampled_from([0.0, 2.0, 4.0, 6.0]))
                m = draw(st.sampled_from([0, 8192, 16384]))
                c, m = min(c, CPUS - cpus_used), min(m, MEM - mem_used)
                cpus_used, mem_used = cpus_used + c, mem_used + m
                slices = tuple(replace(sl, cpus=c, host_memory_mb=m) for sl in r.allocation.slices)
                r = replace(r, allocation=replace(r.allocation, slices=slices))
            held.append(r)
            actual[job_id] = draw(st.floats(1.0, limit))
            predicted[job_id] = draw(st.floats(0.0, limit))
            gpu += n
            job_id += 1
        frees.append(GPUS - gpu)
    free = min(frees)
    if gang:
        per = draw(st.integers(free + 1, GPUS))
        first = job(job_id).gpus(2 * per).nodes(2).limit(100.0).at(0.0)
        if host:
            first.host(cpus=draw(st.sampled_from([0.0, 2.0, 8.0])))
    else:
        first = job(job_id).gpus(draw(st.integers(free + 1, GPUS))).limit(100.0).at(0.0)
    if host and not gang:
        short = draw(st.sampled_from(["gpus", "cpus", "memory"] if free else ["gpus"]))
        if short == "cpus" and cpus_used > 0:
            first.gpus(draw(st.integers(1, free))).host(cpus=draw(st.floats(CPUS - cpus_used + 0.5, CPUS)))
        elif short == "memory" and mem_used > 0:
            first.gpus(draw(st.integers(1, free))).host(mem_mb=draw(st.integers(MEM - mem_used + 1, MEM)))
        else:
            first.host(cpus=draw(st.sampled_from([0.0, 1.0, 4.0])))
    queue = [first.build()]
    actual[job_id] = predicted[job_id] = 50.0
    for _ in range(draw(st.integers(1, 6))):
        job_id += 1
        limit = float(draw(st.integers(5, 300)))
        later = job(job_id).gpus(draw(st.integers(1, 4))).limit(limit).at(float(job_id))
        if host:
            later.host(cpus=draw(st.sampled_from([0.0, 1.0, 4.0, 8.0])), mem_mb=draw(st.sampled_from([0, 4096, 32768])))
        queue.append(later.build())
        actual[job_id] = draw(st.floats(1.0, limit))
        predicted[job_id] = draw(st.floats(0.0, limit))
    return held, queue, actual, predicted, host, gang


@settings(max_examples=150, deadline=None)
@given(scenario())
def test_backfill_with_predictions_never_delays_the_reserved_job(case: Case) -> None:
    held, queue, actual, predicted, host, gang = case
    head = queue[0].job_id
    nodes = tuple(
        node(name).gpus(GPUS).host(cpus=CPUS, memory_mb=MEM).build() if host else node(name).gpus(GPUS).build()
        for name in (("h1", "h2") if gang else ("h1",))
    )
    now = 0.0
    reserved: float | None = None
    started_at: dict[int, float] = {}
    run = {r.job_id: r for r in held}
    waiting = {q.job_id: q for q in queue}
    for _ in range(100):
        snap = Snapshot(nodes=nodes, running=tuple(run.values()), queued=tuple(waiting.values()), usage={})
        plan = decide(snap, POLICY, now)
        runs = {j: predicted[j] for j in (*run, *waiting)}
        estimates = estimate_starts(snap, POLICY, now, plan, runs=runs)
        assert decide(snap, POLICY, now) == plan  # estimating changes nothing of the plan
        wait = plan.waiting.get(head)
        if reserved is None and wait is not None and wait.reason is WaitReason.RESERVED:
            assert wait.estimated_start is not None
            reserved = wait.estimated_start
        if head in estimates and estimates[head].start is not None and reserved is not None:
            # the prediction-based estimate is never later than the guarantee
            assert estimates[head].start <= reserved + 1e-6
        for s in plan.starts:
            req = waiting.pop(s.job_id)
            started_at[s.job_id] = now
            run[s.job_id] = RunningJob(
                s.job_id, s.allocation, started_at=now, time_limit_s=req.time_limit_s, team=req.team
            )
        if head in started_at:
            break
        ends = [r.started_at + actual[j] for j, r in run.items()]
        assert ends, "nothing runs and the head-of-line job cannot start"
        now = min(ends)
        run = {j: r for j, r in run.items() if r.started_at + actual[j] > now + 1e-9}
    assert head in started_at
    assert reserved is not None  # it had to wait: its GPUs were busy
    assert started_at[head] <= reserved + 1e-6, (started_at[head], reserved)


def test_the_prediction_moves_the_estimate_not_the_reservation() -> None:
    """One case by hand: a 100 s-limit job on all GPUs, predicted to run 10 s: the job behind it
    is estimated at 10 s, and its reservation still says 100 s."""
    nodes = (node("h1").gpus(GPUS).build(),)
    snap = Snapshot(
        nodes=nodes,
        running=(running(1, "h1", *range(GPUS), limit=100.0),),
        queued=(job(2).gpus(GPUS).limit(50.0).build(),),
        usage={},
    )
    plan = decide(snap, POLICY, 0.0)
    assert plan.waiting[2].reason is WaitReason.RESERVED and plan.waiting[2].estimated_start == 100.0
    assert estimate_starts(snap, POLICY, 0.0, plan)[2].start == 100.0
    assert estimate_starts(snap, POLICY, 0.0, plan, runs={1: 10.0})[2].start == 10.0
    assert estimate_starts(snap, POLICY, 0.0, plan, runs={1: 500.0})[2].start == 100.0  # never past the limit
    unchanged = replace(snap)
    assert decide(unchanged, POLICY, 0.0) == plan
