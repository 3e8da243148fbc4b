"""CPU cores and host memory beside GPUs (`--cpus`, `--mem`): placement never hands out more of
them than a node has, a job whose GPUs are free but not its CPUs or memory waits naming them, a
request no node could ever hold is refused, and the kept capacity index plans exactly as a fresh
build (its undo log covers the host counts too)."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.estimate import estimate_starts
from gpucluster.core.placement import Capacity
from gpucluster.core.policy import Policy
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import _Cycle, decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, Node, NodeSlice, Plan, Priority, RunningJob
from gpucluster.waits_text import sentence

from .builders import job, node

NOW = 1000.0
H100 = 81920


def _snap(nodes: list[Node], running: list[RunningJob], queued: list[JobRequest]) -> Snapshot:
    return Snapshot(nodes=tuple(nodes), running=tuple(running), queued=tuple(queued))


def _holding(job_id: int, node_name: str, gpus: tuple[int, ...], cpus: float, mem: int, **kw: object) -> RunningJob:
    return RunningJob(job_id, Allocation((NodeSlice(node_name, gpus, cpus=cpus, host_memory_mb=mem),)), **kw)  # type: ignore[arg-type]


def test_a_job_whose_gpus_are_free_but_not_its_cpus_waits_for_cpus() -> None:
    """The first such job holds a reservation (its GPU and CPUs from when they come back); the
    next one, its model reserved already, waits naming the CPUs."""
    n0 = node("n0").gpus(8).host(cpus=4, memory_mb=64 * 1024).build()
    queued = [job(1).host(cpus=3).build(), job(2).host(cpus=2).build(), job(3).host(cpus=2).build()]
    plan = decide(_snap([n0], [], queued), now=NOW)
    assert [s.job_id for s in plan.starts] == [1]
    assert plan.starts[0].allocation.slices[0].cpus == 3
    held = plan.waiting[2]
    assert held.reason is WaitReason.RESERVED and "with 2 CPU(s)" in sentence(held)
    assert held.estimated_start == NOW + Policy().default_time_limit_s
    wait = plan.waiting[3]
    assert wait.reason is WaitReason.CPUS
    assert "needs 2 CPU(s)" in sentence(wait) and "at most 1 CPU(s) left" in sentence(wait)
    # Once job 1 runs, job 3 still waits for CPUs; once it ended, jobs 2 and 3 start.
    first = RunningJob(1, plan.starts[0].allocation, started_at=NOW)
    again = decide(_snap([n0], [first], queued[1:]), now=NOW + 1)
    assert again.waiting[2].reason is WaitReason.RESERVED
    assert again.waiting[3].reason is WaitReason.CPUS
    after = decide(_snap([n0], [], queued[1:]), now=NOW + 2)
    assert [s.job_id for s in after.starts] == [2, 3]


def test_a_job_short_of_host_memory_waits_for_memory() -> None:
    n0 = node("n0").gpus(8).host(cpus=64, memory_mb=100 * 1024).build()
    busy = _holding(9, "n0", (0,), 1, 80 * 1024, started_at=0.0)
    asks = [job(1).host(cpus=1, mem_mb=32 * 1024).build(), job(2).host(cpus=1, mem_mb=32 * 1024).build()]
    plan = decide(_snap([n0], [busy], asks), now=NOW)
    assert not plan.starts
    assert plan.waiting[1].reason is WaitReason.RESERVED and "32 GiB of memory" in sentence(plan.waiting[1])
    assert plan.waiting[2].reason is WaitReason.MEMORY
    assert "needs 32 GiB of host memory" in sentence(plan.waiting[2])


def test_cpus_pick_the_node_that_has_them() -> None:
    """Best fit by GPUs would take n0 (fewest free GPUs); only n1 has the CPUs left."""
    n0 = node("n0").gpus(2).host(cpus=4).build()
    n1 = node("n1").gpus(8).host(cpus=32).build()
    plan = decide(_snap([n0, n1], [], [job(1).host(cpus=8).build()]), now=NOW)
    assert plan.starts[0].allocation.slices[0].node == "n1"
    plan = decide(_snap([n0, n1], [], [job(1).host(cpus=2).build()]), now=NOW)
    assert plan.starts[0].allocation.slices[0].node == "n0"


def test_a_request_no_node_can_ever_hold_is_no_fit_naming_the_cpus() -> None:
    n0 = node("n0").gpus(8).host(cpus=16, memory_mb=64 * 1024).build()
    plan = decide(_snap([n0], [], [job(1).host(cpus=32).build()]), now=NOW)
    assert plan.waiting[1].reason is WaitReason.NO_FIT
    assert "32 CPU(s)" in sentence(plan.waiting[1]) and "16 CPU(s)" in sentence(plan.waiting[1])


def test_a_node_that_does_not_account_host_resources_takes_any_request() -> None:
    n0 = node("n0").gpus(8).build()
    plan = decide(_snap([n0], [], [job(1).host(cpus=500, mem_mb=10**7).build()]), now=NOW)
    assert [s.job_id for s in plan.starts] == [1]


def test_a_job_over_nodes_holds_its_cpus_split_like_its_gpus() -> None:
    nodes = [node(f"n{i}").gpus(8).host(cpus=16, memory_mb=1024).build() for i in range(2)]
    plan = decide(_snap(nodes, [], [job(1).gpus(16).host(cpus=32, mem_mb=2048).build()]), now=NOW)
    slices = plan.starts[0].allocation.slices
    assert sorted((s.node, s.cpus, s.host_memory_mb) for s in slices) == [("n0", 16, 1024), ("n1", 16, 1024)]
    gang = decide(_snap(nodes, [], [job(2).gpus(4).nodes(2).host(cpus=20).build()]), now=NOW)
    assert sorted(s.cpus for s in gang.starts[0].allocation.slices) == [10, 10]


def test_a_preemptor_stops_jobs_only_when_that_frees_its_cpus_too() -> None:
    n0 = node("n0").gpus(2).host(cpus=8).build()
    low = _holding(5, "n0", (0,), 7, 0, priority=Priority.LOW, started_at=0.0)
    crit = _holding(6, "n0", (1,), 1, 0, priority=Priority.CRITICAL, started_at=0.0)
    high = job(1).priority("high").host(cpus=6).build()
    plan = decide(_snap([n0], [low, crit], [high]), now=NOW)
    assert [p.job_id for p in plan.preemptions] == [5]
    # A low job holding a GPU but few CPUs, while a protected one holds the rest: stopping the
    # low job frees no room for 6 CPUs, so nothing is preempted and the job says why it waits.
    low2 = _holding(5, "n0", (0,), 1, 0, priority=Priority.LOW, started_at=0.0)
    crit2 = _holding(6, "n0", (1,), 7, 0, priority=Priority.CRITICAL, started_at=0.0)
    plan = decide(_snap([n0], [low2, crit2], [high]), now=NOW)
    assert not plan.preemptions and not plan.starts


def test_take_and_release_count_host_resources_back_exactly() -> None:
    n0 = node("n0").gpus(4).host(cpus=8, memory_mb=4096).build()
    cap = Capacity([n0], [])
    request = job(1).gpus(2).host(cpus=6, mem_mb=3000).build()
    alloc = cap.place(request, "H100")
    assert alloc is not None
    cap.take(alloc)
    assert cap.free_host("n0") == (2, 1096)
    assert cap.place(job(2).host(cpus=3).build(), "H100") is None
    cap.release(alloc)
    assert cap.free_host("n0") == (8, 4096)


# ---- properties --------------------------------------------------------------------------------


@st.composite
def host_scenarios(draw: st.DrawFn) -> tuple[Snapshot, Policy]:
    nodes: list[Node] = []
    for i in range(draw(st.integers(1, 4))):
        b = node(f"n{i}").gpus(draw(st.integers(1, 8)), draw(st.sampled_from(["H100", "A100"])), H100)
        accounted = draw(st.booleans()) or i > 0
        if accounted:
            b.host(cpus=draw(st.sampled_from([2, 4, 8, 16])), memory_mb=draw(st.sampled_from([1024, 4096, 16384])))
        nodes.append(b.build())
    running: list[RunningJob] = []
    next_id = 1000
    for nd in nodes:
        free_cpus = nd.cpus if nd.cpus is not None else 8.0
        free_mem = nd.memory_mb if nd.memory_mb is not None else 4096
        idx = 0
        while idx < len(nd.gpus) and draw(st.booleans()):
            cpus = min(free_cpus, draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0])))
            mem = min(free_mem, draw(st.sampled_from([0, 256, 1024])))
            free_cpus -= cpus
            free_mem -= mem
            priority = draw(st.sampled_from(list(Priority)))
            alloc = Allocation((NodeSlice(nd.name, (idx,), cpus=cpus, host_memory_mb=mem),))
            limit = draw(st.sampled_from([None, 1500.0, 3000.0, 9000.0]))
            running.append(RunningJob(next_id, alloc, priority=priority, started_at=0.0, time_limit_s=limit))
            next_id += 1
            idx += 1
    queued = []
    for j in range(1, draw(st.integers(1, 12)) + 1):
        b = job(j).gpus(draw(st.sampled_from([0.5, 1, 1, 2, 3, 4, 8, 12])))
        b.priority(draw(st.sampled_from(["low", "normal", "high"])))
        b.host(cpus=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0, 7.0])), mem_mb=draw(st.sampled_from([0, 512, 2048])))
        if draw(st.integers(0, 5)) == 0:
            b.gpus(4).nodes(2)
        b.limit(draw(st.sampled_from([None, 60.0, 600.0, 6000.0])))
        queued.append(b.build())
    policy = Policy(backfill=draw(st.booleans()))
    return _snap(nodes, running, queued), policy


def _check_host_never_overcommitted(snap: Snapshot, plan: Plan) -> None:
    preempted = {p.job_id for p in plan.preemptions}
    cpus: dict[str, float] = defaultdict(float)
    mem: dict[str, int] = defaultdict(int)
    gpus: set[tuple[str, int]] = set()
    allocations = [r.allocation for r in snap.running if r.job_id not in preempted]
    allocations += [r.allocation for r in snap.running if r.job_id in preempted]  # still stopping
    allocations += [s.allocation for s in plan.starts]
    for a in allocations:
        for s in a.slices:
            cpus[s.node] += s.cpus
            mem[s.node] += s.host_memory_mb
            if s.share >= 1:
                for i in s.gpu_indices:
                    assert (s.node, i) not in gpus
                    gpus.add((s.node, i))
    for nd in snap.nodes:
        if nd.cpus is not None:
            assert cpus[nd.name] <= nd.cpus + 1e-6, (nd.name, cpus[nd.name], nd.cpus)
        if nd.memory_mb is not None:
            assert mem[nd.name] <= nd.memory_mb, (nd.name, mem[nd.name], nd.memory_mb)
    requests = {j.job_id: j for j in snap.queued}
    for st_ in plan.starts:
        asked = requests[st_.job_id]
        assert abs(sum(s.cpus for s in st_.allocation.slices) - asked.cpus) < 1e-6
        assert sum(s.host_memory_mb for s in st_.allocation.slices) >= asked.mem_mb


PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(host_scenarios())
def test_placement_never_overcommits_cpus_or_memory(scenario: tuple[Snapshot, Policy]) -> None:
    snap, policy = scenario
    plan = decide(snap, policy, NOW)
    _check_host_never_overcommitted(snap, plan)
    assert set(plan.waiting) | {s.job_id for s in plan.starts} == {j.job_id for j in snap.queued}


# The `--nodes` case found: 4 GPUs on 2 nodes of 2, 5 and 1 GPUs; job 1 takes n0 and 2 of n1 for an
# hour, so job 2 has 2 on each of two nodes only when job 1 ends, not when job 1000 does.
_GANG = _snap(
    [
        node("n0").gpus(2).build(),
        *(node(n).gpus(k).host(cpus=2, memory_mb=1024).build() for n, k in (("n1", 5), ("n2", 1))),
    ],
    [RunningJob(1000, Allocation((NodeSlice("n1", (0,)),)), priority=Priority.LOW, started_at=0.0)],
    [job(j).gpus(4).nodes(2).priority("low").build() for j in (1, 2)],
)


@PROPS
@given(host_scenarios())
@example((_GANG, Policy()))
def test_backfill_never_takes_what_a_reservation_holds(scenario: tuple[Snapshot, Policy]) -> None:
    """A job first in line with a reservation (waiting for GPUs, CPUs or memory), asking for
    CPUs or memory (`reserve_host`) or not (`reserve`), can start at its reserved time: with
    every job running then (those this plan starts included) holding its GPUs, CPUs and memory
    until its own time limit, it is placed. So what backfill started in front of it never
    delays it. (A GPU-only `--nodes` reservation once counted the model's GPUs in all, not per
    node: found here, 4 GPUs on 2 nodes of 3 and 2 GPUs reserved while a half-GPU job held one
    of the 2 past the shadow time.)"""
    snap, policy = scenario
    plan = decide(snap, policy, NOW)
    _check_reservations_hold(snap, policy, plan)


def _check_reservations_hold(snap: Snapshot, policy: Policy, plan: Plan) -> None:
    default = policy.default_time_limit_s
    stopping = {p.job_id for p in plan.preemptions}
    requests = {j.job_id: j for j in snap.queued}
    held: list[tuple[RunningJob, float]] = []
    for r in snap.running:
        if r.job_id in stopping:
            end = NOW + policy.preemption.grace_period_s
        else:
            end = r.started_at + (r.time_limit_s or default)
        held.append((r, max(end, NOW)))
    for s in plan.starts:
        limit = requests[s.job_id].time_limit_s or default
        held.append((RunningJob(s.job_id, s.allocation, started_at=NOW), NOW + limit))
    for job_id, wait in plan.waiting.items():
        if wait.reason is not WaitReason.RESERVED:
            continue
        assert wait.estimated_start is not None
        at = wait.estimated_start
        cap = Capacity(snap.nodes, [r for r, end in held if end > at + 1e-9])
        asked = requests[job_id]
        assert any(cap.place(asked, m) is not None for m in cap.acceptable_models(asked)), (job_id, at, snap, plan)


@PROPS
@given(host_scenarios())
def test_a_kept_index_plans_host_requests_as_a_fresh_build(scenario: tuple[Snapshot, Policy]) -> None:
    """The kept index lends its host counts to each cycle's trial and undoes the writes: two
    cycles through it give the plan of a fresh build, and leave it as it was."""
    snap, policy = scenario
    fresh = decide(snap, policy, NOW)
    index = CapacityIndex()
    kept = Snapshot(nodes=snap.nodes, running=snap.running, queued=snap.queued, capacity=index)
    assert decide(kept, policy, NOW) == fresh
    assert decide(kept, policy, NOW) == fresh
    base = index.capacity(snap.nodes, snap.running)
    again = Capacity(snap.nodes, snap.running)
    assert base.used_cpus == again.used_cpus and base.used_hmem == again.used_hmem


class _EveryJobConsidered(_Cycle):
    share_waits = False


@PROPS
@given(host_scenarios())
def test_shortcuts_change_no_plan_with_host_requests(scenario: tuple[Snapshot, Policy]) -> None:
    """Answering a job from an equal one's wait, and the plan-only cycle's early stop (the
    simulator's), give the plan of a cycle that considers every job, with CPUs and memory asked."""
    snap, policy = scenario
    full = decide(snap, policy, NOW)
    slow = _EveryJobConsidered(snap, policy, NOW).run()
    assert (full.starts, full.preemptions) == (slow.starts, slow.preemptions)
    assert list(full.waiting.items()) == list(slow.waiting.items())
    quick = decide(snap, policy, NOW, reasons=False)
    slow_quick = _EveryJobConsidered(snap, policy, NOW, reasons=False).run()
    assert (quick.starts, quick.preemptions) == (full.starts, full.preemptions)
    assert (slow_quick.starts, slow_quick.preemptions) == (full.starts, full.preemptions)


# ---- backfill with CPUs and memory ------------------------------------------------------------


def test_backfill_never_delays_a_job_waiting_for_cpus() -> None:
    """One node of 8 GPUs and 16 CPUs: a running job holds 8 CPUs for an hour; the first job in
    line asks for 12 CPUs (its GPU is free, its CPUs are not); a later job asks for 8 CPUs for
    10 hours. The later job must not start: it would push the first job's start from 1 h to
    11 h. The first job holds a reservation from the running job's end."""
    n0 = node("n0").gpus(8).host(cpus=16).build()
    busy = _holding(9, "n0", (0,), 8, 0, started_at=NOW, time_limit_s=3600.0)
    first = job(1).host(cpus=12).limit(3600).at(1.0).build()
    later = job(2).host(cpus=8).limit(36000).at(2.0).build()
    plan = decide(_snap([n0], [busy], [first, later]), now=NOW)
    assert not plan.starts
    wait = plan.waiting[1]
    assert wait.reason is WaitReason.RESERVED and wait.estimated_start == NOW + 3600, wait
    assert "12 CPU(s)" in sentence(wait) and "n0" in sentence(wait)
    assert plan.waiting[2].reason is WaitReason.BEHIND_RESERVATION
    # A later job that ends before the reservation's start passes it.
    short = job(3).host(cpus=4).limit(1800).at(3.0).build()
    plan = decide(_snap([n0], [busy], [first, later, short]), now=NOW)
    assert [s.job_id for s in plan.starts] == [3]
    # The estimates count the CPUs: the first job starts when the running job ends.
    snap = _snap([n0], [busy], [first, later])
    est = estimate_starts(snap, Policy(), NOW, decide(snap, now=NOW))
    assert est[1].start == NOW + 3600
    assert est[2].start == NOW + 2 * 3600  # 12 + 8 CPUs exceed 16: after the first job's hour


def test_backfill_never_delays_a_job_waiting_for_memory_on_a_kept_index() -> None:
    n0 = node("n0").gpus(8).host(cpus=64, memory_mb=100 * 1024).build()
    busy = _holding(9, "n0", (0,), 1, 80 * 1024, started_at=NOW, time_limit_s=600.0)
    first = job(1).host(mem_mb=64 * 1024).limit(600).at(1.0).build()
    later = job(2).host(mem_mb=20 * 1024).limit(6000).at(2.0).build()
    snap = Snapshot(nodes=(n0,), running=(busy,), queued=(first, later), capacity=CapacityIndex(told=True))
    for _ in range(2):
        plan = decide(snap, Policy(), NOW)
        assert not plan.starts
        assert plan.waiting[1].reason is WaitReason.RESERVED and plan.waiting[1].estimated_start == NOW + 600
