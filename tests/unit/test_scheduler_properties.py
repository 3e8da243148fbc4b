"""Properties of `decide` over random clusters (mixed models, topology domains), running jobs (whole,
multi-node and fractional, some stopping), job mixes and random policies; then closed-loop runs on a
fake clock (tests/unit/cycles.py) for "every feasible job eventually runs"."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpucluster.core.attained import may_take, rank_of
from gpucluster.core.placement import Capacity
from gpucluster.core.policy import Policy, Preemption, Team, fifo_policy, priority_policy
from gpucluster.core.queueing import CHARGE_HORIZON_S, TeamQueues
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import _Cycle, decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, Node, NodeSlice, Plan, Priority, RunningJob
from gpucluster.waits_text import sentence

from .builders import job, node
from .cycles import Cycles

MODELS = {"H100": 81920, "A100": 40960, "L4": 24576}
TEAMS = ("a", "b", "c")
NOW = 10_000.0
EPS = 1e-6

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---- strategies --------------------------------------------------------------------------------


@st.composite
def nodes(draw: st.DrawFn, min_nodes: int = 1, max_nodes: int = 5) -> tuple[Node, ...]:
    out = []
    for n in range(draw(st.integers(min_nodes, max_nodes))):
        b = node(f"n{n}")
        for _ in range(draw(st.integers(1, 2))):
            model = draw(st.sampled_from(sorted(MODELS)))
            domain = draw(st.sampled_from([None, "d0", "d1"]))
            b.gpus(draw(st.integers(1, 8)), model, MODELS[model], domain=domain)
        out.append(b.build())
    return tuple(out)


@st.composite
def running_jobs(draw: st.DrawFn, cluster: tuple[Node, ...], first_id: int = 1000) -> tuple[RunningJob, ...]:
    """Consistent running jobs: whole GPUs of one model (sometimes over two nodes) and fractions."""
    free: dict[tuple[str, str], list[int]] = defaultdict(list)  # (node, model) -> free GPU indices
    for nd in cluster:
        for g in nd.gpus:
            free[(nd.name, g.model)].append(g.index)
    out: list[RunningJob] = []
    next_id = first_id
    for _ in range(draw(st.integers(0, 10))):
        keys = sorted(k for k, v in free.items() if v)
        if not keys:
            break
        (name, model) = draw(st.sampled_from(keys))
        kind = draw(st.sampled_from(["whole", "whole", "spread", "fraction"]))
        slices: list[NodeSlice] = []
        if kind == "fraction":
            idx = free[(name, model)].pop(0)
            left, mem_left = 1.0, MODELS[model]
            for _ in range(draw(st.integers(1, 3))):
                share = draw(st.sampled_from([0.1, 0.25, 0.5]))
                mem = int(draw(st.sampled_from([0.1, 0.25, 0.5, 0.6])) * MODELS[model])
                if share > left + EPS or mem > mem_left:
                    break
                left -= share
                mem_left -= mem
                out.append(_running(draw, next_id, Allocation((NodeSlice(name, (idx,), share, mem),))))
                next_id += 1
            continue
        k = draw(st.integers(1, len(free[(name, model)])))
        slices.append(NodeSlice(name, tuple(free[(name, model)][:k])))
        del free[(name, model)][:k]
        if kind == "spread":
            others = sorted(n for (n, m), v in free.items() if m == model and n != name and len(v) >= k)
            if others:
                other = draw(st.sampled_from(others))
                slices.append(NodeSlice(other, tuple(free[(other, model)][:k])))
                del free[(other, model)][:k]
        out.append(_running(draw, next_id, Allocation(tuple(slices))))
        next_id += 1
    return tuple(out)


def _running(draw: st.DrawFn, job_id: int, allocation: Allocation) -> RunningJob:
    started = draw(st.sampled_from([0.0, NOW - 5000, NOW - 100, NOW - 1]))
    return RunningJob(
        job_id,
        allocation,
        team=draw(st.sampled_from(TEAMS)),
        priority=draw(st.sampled_from(list(Priority))),
        started_at=started,
        time_limit_s=draw(st.sampled_from([None, 600.0, 7200.0, 86400.0])),
        last_checkpoint_at=draw(st.sampled_from([None, started, NOW - 50])),
        stopping=draw(st.integers(0, 9)) == 0,
    )


@st.composite
def requests(draw: st.DrawFn, count: int, first_id: int = 1, at_most: float = NOW) -> list[JobRequest]:
    out = []
    for jid in range(first_id, first_id + count):
        kind = draw(st.sampled_from(["whole", "whole", "whole", "fraction", "memory", "nodes"]))
        b = job(jid).team(draw(st.sampled_from(TEAMS))).priority(draw(st.sampled_from(list(Priority))))
        b.at(draw(st.sampled_from([0.0, at_most / 2, at_most - 10, at_most]))).limit(
            draw(st.sampled_from([None, 300.0, 3600.0, 20000.0]))
        )
        if kind == "whole":
            b.gpus(draw(st.sampled_from([1, 1, 2, 3, 4, 8, 12])))
        elif kind == "fraction":
            b.gpus(draw(st.sampled_from([0.1, 0.25, 0.5, 0.75])))
        elif kind == "memory":
            b.gpus(1).memory(draw(st.sampled_from([4096, 10240, 30000, 50000])))
        else:
            per = draw(st.integers(1, 4))
            count_nodes = draw(st.integers(1, 3))
            b.gpus(per * count_nodes).nodes(count_nodes)
        types = draw(st.lists(st.sampled_from([*sorted(MODELS), "B200"]), unique=True, max_size=3))
        b.gpu_types(*types)
        if draw(st.integers(0, 4)) == 0:
            b.min_memory(draw(st.sampled_from([30000, 50000])))
        out.append(b.build())
    return out


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    base = draw(st.sampled_from(["random", "random", "random", "fifo", "priority", "default"]))
    if base == "fifo":
        return fifo_policy()
    if base == "priority":
        return priority_policy()
    if base == "default":
        return Policy()
    teams = {}
    for name in TEAMS:
        quota = {m: float(draw(st.integers(0, 6))) for m in MODELS if draw(st.booleans())}
        teams[name] = Team(
            name,
            weight=draw(st.sampled_from([0.5, 1.0, 3.0])),
            org=draw(st.sampled_from([None, "o1", "o2"])),
            quota=quota,
            max_borrow=draw(st.sampled_from([None, None, 0.0, 2.0, 8.0])),
            max_lend=draw(st.sampled_from([None, None, 0.0, 2.0])),
        )
    from gpucluster.core.policy import Org

    protected = draw(st.sampled_from([{Priority.CRITICAL}, {Priority.CRITICAL, Priority.HIGH}, set()]))
    return Policy(
        teams=teams,
        orgs={"o1": Org("o1", 2.0), "o2": Org("o2", 1.0)},
        preemption=Preemption(
            enabled=draw(st.booleans()),
            grace_period_s=draw(st.sampled_from([0.0, 30.0, 300.0])),
            min_runtime_s=draw(st.sampled_from([0.0, 60.0, 3600.0])),
            protected_classes=frozenset(protected),
            reclaim_quota=draw(st.booleans()),
        ),
        fair_share=draw(st.booleans()),
        priorities=draw(st.booleans()),
        backfill=draw(st.booleans()),
        default_time_limit_s=draw(st.sampled_from([600.0, 3600.0])),
        starvation_age_s=draw(st.sampled_from([1000.0, 86400.0])),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Snapshot, Policy]:
    cluster = draw(nodes())
    runs = draw(running_jobs(cluster))
    queued = draw(requests(draw(st.integers(0, 14))))
    usage = {t: draw(st.sampled_from([0.0, 100.0, 1e5])) for t in TEAMS}
    snap = Snapshot(cluster, runs, tuple(draw(st.permutations(queued))), usage)
    return snap, draw(policies())


# ---- checks ------------------------------------------------------------------------------------


def gpu_index(snap: Snapshot) -> dict[tuple[str, int], tuple[str, int, str | None]]:
    return {(n.name, g.index): (g.model, g.memory_mb, g.domain) for n in snap.nodes for g in n.gpus}


def check_no_overcommit(snap: Snapshot, plan: Plan) -> None:
    gpus = gpu_index(snap)
    share: dict[tuple[str, int], float] = defaultdict(float)
    mem: dict[tuple[str, int], int] = defaultdict(int)
    allocations = [r.allocation for r in snap.running] + [s.allocation for s in plan.starts]
    for a in allocations:
        for s in a.slices:
            for i in s.gpu_indices:
                key = (s.node, i)
                assert key in gpus, f"GPU {key} does not exist"
                share[key] += s.share
                mem[key] += s.memory_mb if s.memory_mb is not None else gpus[key][1]
    for key, used in share.items():
        assert used <= 1 + EPS, f"GPU {key} is {used:.0%} handed out"
        assert mem[key] <= gpus[key][1], f"GPU {key}: {mem[key]} MiB of {gpus[key][1]} handed out"


def check_starts(snap: Snapshot, plan: Plan) -> None:
    gpus = gpu_index(snap)
    queued = {j.job_id: j for j in snap.queued}
    for s in plan.starts:
        j = queued[s.job_id]
        a = s.allocation
        models = {gpus[(sl.node, i)][0] for sl in a.slices for i in sl.gpu_indices}
        assert len(models) == 1, f"job {j.job_id} mixes models {models}"
        (model,) = models
        if j.gpu_types:
            assert model in j.gpu_types, f"job {j.job_id} got {model}, accepts {j.gpu_types}"
        if j.min_gpu_memory_mb is not None:
            assert MODELS[model] >= j.min_gpu_memory_mb
        assert len({sl.node for sl in a.slices}) == len(a.slices), "a node appears twice"
        if j.fractional:
            ((sl),) = a.slices
            assert len(sl.gpu_indices) == 1 and sl.share <= 1 + EPS
            if j.gpus < 1:
                assert sl.share >= j.gpus - EPS
            if j.gpu_memory_mb is not None:  # a memory share: at least that memory, and its fraction
                assert sl.memory_mb is not None and sl.memory_mb >= j.gpu_memory_mb
                assert sl.share >= j.gpu_memory_mb / MODELS[model] - EPS
        else:  # gang: exactly the GPUs asked for, whole
            assert all(sl.share == 1.0 for sl in a.slices)
            assert len(a.gpu_keys()) == int(j.gpus) == a.gpu_count
            if j.nodes:
                assert len(a.slices) == j.nodes
                assert {len(sl.gpu_indices) for sl in a.slices} == {int(j.gpus) // j.nodes}


def check_every_job_accounted(snap: Snapshot, plan: Plan) -> None:
    started = [s.job_id for s in plan.starts]
    assert len(started) == len(set(started))
    assert set(started).isdisjoint(plan.waiting)
    assert set(started) | set(plan.waiting) == {j.job_id for j in snap.queued}
    for jid, w in plan.waiting.items():
        assert isinstance(w.reason, WaitReason) and sentence(w), (jid, w)
        if w.reason is WaitReason.RESERVED:
            assert w.estimated_start is not None and w.estimated_start >= NOW
        if w.estimated_start is not None:
            assert w.reason is WaitReason.RESERVED


def used_by(snap: Snapshot, plan: Plan, team: str, model: str) -> float:
    """GPUs of `model` the team holds at most during the cycle: running, plus what the plan starts for it."""
    gpus = gpu_index(snap)
    queued = {j.job_id: j for j in snap.queued}
    allocations = [r.allocation for r in snap.running if r.team == team]
    allocations += [s.allocation for s in plan.starts if queued[s.job_id].team == team]
    return sum(
        len(s.gpu_indices) * s.share
        for a in allocations
        for s in a.slices
        if gpus[(s.node, s.gpu_indices[0])][0] == model
    )


def check_preemptions(snap: Snapshot, policy: Policy, plan: Plan) -> None:
    gpus = gpu_index(snap)
    running = {r.job_id: r for r in snap.running}
    queued = {j.job_id: j for j in snap.queued}
    victims = [p.job_id for p in plan.preemptions]
    assert len(victims) == len(set(victims)), "a job preempted twice"
    if not policy.preemption.enabled:
        assert not victims
    for p in plan.preemptions:
        v, j = running[p.job_id], queued[p.for_job]
        assert policy.preemptible(v.priority), f"protected job {v.job_id} ({v.priority.label}) preempted"
        assert not v.stopping
        assert NOW - v.started_at >= policy.preemption.min_runtime_s
        model = gpus[(v.allocation.slices[0].node, v.allocation.slices[0].gpu_indices[0])][0]
        lower = policy.priorities and v.priority < j.priority
        quota = policy.team(v.team).quota.get(model, 0.0)
        borrower = v.team != j.team and used_by(snap, plan, v.team, model) > quota + EPS
        # Least attained service (the default ordering since issue 25): the rule of core/attained.py.
        rank = rank_of(j, policy.ordering, snap.attained, {}, NOW)
        las = policy.preempts_for_attained_service and v.priority == j.priority
        las = las and may_take(rank, v, policy.ordering, snap.attained, NOW)
        assert lower or las or (policy.preemption.reclaim_quota and borrower), (
            f"{p}: neither lower class, nor less attained service, nor a borrower"
        )
    check_guarantees_kept(snap, policy, plan)
    check_victims_needed(snap, plan)


def _span(cap: Capacity, model: str, n: int) -> int | None:
    """The fewest nodes holding `n` free whole GPUs of `model` (None: fewer are free)."""
    counts = sorted((len(idxs) for idxs in cap.free[model].values()), reverse=True)
    for k in range(len(counts)):
        if sum(counts[: k + 1]) >= n:
            return k + 1
    return None


def check_victims_needed(snap: Snapshot, plan: Plan) -> None:
    """No victim is taken that was not needed: with every other victim (and every stopping job)
    gone, keeping it running leaves the preemptor no room of its shape, or (a job larger than
    a node) room only over more nodes. Worked out on a `Capacity` of what is left, the plan's
    starts included (a start can only take room, so this never blames a needed victim)."""
    gpus = gpu_index(snap)
    queued = {j.job_id: j for j in snap.queued}
    running = {r.job_id: r for r in snap.running}
    by_preemptor: dict[int, list[int]] = defaultdict(list)
    for p in plan.preemptions:
        by_preemptor[p.for_job].append(p.job_id)
    gone = {p.job_id for p in plan.preemptions} | {r.job_id for r in snap.running if r.stopping}
    starts = [RunningJob(s.job_id, s.allocation) for s in plan.starts]

    def capacity(keep: int | None) -> Capacity:
        left = [r for r in snap.running if r.job_id not in gone or r.job_id == keep]
        return Capacity(snap.nodes, [*left, *starts])

    for for_job, victims in by_preemptor.items():
        j = queued[for_job]
        first = running[victims[0]].allocation.slices[0]
        model = gpus[(first.node, first.gpu_indices[0])][0]
        spread = not j.fractional and not j.nodes and int(j.gpus) > capacity(None).node_size[model]
        without = capacity(None)
        span = _span(without, model, int(j.gpus)) if spread else None
        for v in victims:
            cap = capacity(v)
            if not cap.fits(j, model):
                continue
            assert spread and span is not None, f"job {v} preempted for job {for_job} but not needed: {plan}"
            got = _span(cap, model, int(j.gpus))
            assert got is None or got > span, f"job {v} not needed for job {for_job} to span {span} nodes"


def check_guarantees_kept(snap: Snapshot, policy: Policy, plan: Plan) -> None:
    """A team's quota protects its jobs from another team's preemptor, unless that preemptor is
    of a higher class and its own team stays within its guarantee. Checked where no preemptor
    of the plan could be such an exception for the team (a job of the same class or above, or
    one whose team has no quota it could stay within)."""
    gpus = gpu_index(snap)
    running = {r.job_id: r for r in snap.running}
    queued = {j.job_id: j for j in snap.queued}
    taken: dict[tuple[str, str], float] = defaultdict(float)  # (team, model) -> GPUs preempted
    exempt: set[tuple[str, str]] = set()  # a preemptor might have been allowed below the quota
    for p in plan.preemptions:
        v, j = running[p.job_id], queued[p.for_job]
        model = gpus[(v.allocation.slices[0].node, v.allocation.slices[0].gpu_indices[0])][0]
        if v.team == j.team:
            continue
        taken[(v.team, model)] += v.allocation.gpu_count
        own_quota = policy.team(j.team).quota.get(model, 0.0)
        if policy.priorities and v.priority < j.priority and j.gpus <= own_quota:
            exempt.add((v.team, model))
    for (team, model), gone in taken.items():
        quota = policy.team(team).quota.get(model, 0.0)
        if quota <= 0 or (team, model) in exempt:
            continue
        before = sum(
            len(s.gpu_indices) * s.share
            for r in snap.running
            if r.team == team
            for s in r.allocation.slices
            if gpus[(s.node, s.gpu_indices[0])][0] == model
        )
        assert before - gone >= min(quota, before) - EPS, (
            f"team {team} preempted from {before:g} to {before - gone:g} {model} GPUs, below its quota {quota:g}"
        )


@FAST
@given(scenarios())
def test_one_cycle_invariants(scenario: tuple[Snapshot, Policy]) -> None:
    snap, policy = scenario
    plan = decide(snap, policy, now=NOW)
    check_every_job_accounted(snap, plan)
    check_no_overcommit(snap, plan)
    check_starts(snap, plan)
    check_preemptions(snap, policy, plan)


@FAST
@given(scenarios())
def test_protected_jobs_are_never_preempted_even_by_critical_jobs(scenario: tuple[Snapshot, Policy]) -> None:
    snap, policy = scenario
    crit = Snapshot(
        snap.nodes,
        snap.running,
        tuple(replace(j, priority=Priority.CRITICAL) for j in snap.queued),
        snap.usage,
    )
    plan = decide(crit, policy, now=NOW)
    running = {r.job_id: r for r in crit.running}
    assert all(policy.preemptible(running[p.job_id].priority) for p in plan.preemptions)
    assert all(running[p.job_id].priority is not Priority.CRITICAL for p in plan.preemptions) or (
        Priority.CRITICAL not in policy.preemption.protected_classes
    )


@FAST
@given(scenarios())
def test_a_plan_is_deterministic_and_independent_of_input_order(scenario: tuple[Snapshot, Policy]) -> None:
    snap, policy = scenario
    a = decide(snap, policy, now=NOW)
    b = decide(Snapshot(snap.nodes, snap.running, tuple(reversed(snap.queued)), snap.usage), policy, now=NOW)
    assert a.starts == b.starts
    assert a.waiting == b.waiting


# ---- shortcuts that must not change a plan -----------------------------------------------------


@st.composite
def crowded(draw: st.DrawFn) -> tuple[Snapshot, Policy]:
    """A cluster every GPU of which is held, by jobs of every shape (whole GPUs on one node or
    over two, GPUs shared by two to four fractional jobs), mostly low and normal, and jobs of
    every shape queued above them (a share, a share by memory, whole GPUs, a gang over M
    nodes, more than a node): most cycles preempt, with the policy's every rule in force."""
    cluster = draw(nodes(min_nodes=1, max_nodes=4))
    free: dict[tuple[str, str], list[int]] = defaultdict(list)
    for nd in cluster:
        for g in nd.gpus:
            free[(nd.name, g.model)].append(g.index)
    runs: list[RunningJob] = []
    for (name, model), idxs in sorted(free.items()):
        while idxs:
            if draw(st.booleans()):
                k = draw(st.integers(1, len(idxs)))
                slices = [NodeSlice(name, tuple(idxs[:k]))]
                del idxs[:k]
                others = sorted(n for (n, m), v in free.items() if m == model and n != name and len(v) >= k)
                if others and draw(st.integers(0, 3)) == 0:
                    other = draw(st.sampled_from(others))
                    slices.append(NodeSlice(other, tuple(free[(other, model)][:k])))
                    del free[(other, model)][:k]
                runs.append(_crowd(draw, 1000 + len(runs), Allocation(tuple(slices))))
                continue
            idx = idxs.pop(0)
            parts = draw(st.sampled_from([(0.5, 0.5), (0.25, 0.25, 0.5), (0.25, 0.25, 0.25, 0.25), (0.5, 0.25)]))
            for share in parts:
                mem = int(share * MODELS[model])
                runs.append(_crowd(draw, 1000 + len(runs), Allocation((NodeSlice(name, (idx,), share, mem),))))
    queued = []
    for jid in range(1, draw(st.integers(1, 4)) + 1):
        b = job(jid).priority(draw(st.sampled_from([Priority.HIGH, Priority.HIGH, Priority.NORMAL, Priority.CRITICAL])))
        b.team(draw(st.sampled_from(TEAMS))).at(draw(st.sampled_from([0.0, 100.0, NOW])))
        b.limit(draw(st.sampled_from([None, 300.0, 3600.0])))
        kind = draw(st.sampled_from(["fraction", "memory", "whole", "nodes", "big"]))
        if kind == "fraction":
            b.gpus(draw(st.sampled_from([0.1, 0.25, 0.5, 0.75])))
        elif kind == "memory":
            b.gpus(1).memory(draw(st.sampled_from([10240, 30000, 50000])))
        elif kind == "whole":
            b.gpus(draw(st.integers(1, 4)))
        elif kind == "nodes":
            m = draw(st.integers(1, 3))
            b.gpus(m * draw(st.integers(1, 3))).nodes(m)
        else:
            b.gpus(draw(st.sampled_from([9, 10, 12])))
        queued.append(b.build())
    policy = draw(policies())
    policy = replace(policy, priorities=True, preemption=replace(policy.preemption, enabled=True))
    usage = {t: draw(st.sampled_from([0.0, 100.0, 1e5])) for t in TEAMS}
    return Snapshot(cluster, tuple(runs), tuple(queued), usage), policy


def _crowd(draw: st.DrawFn, job_id: int, allocation: Allocation) -> RunningJob:
    job = _running(draw, job_id, allocation)
    return replace(
        job, priority=draw(st.sampled_from([Priority.LOW, Priority.LOW, Priority.NORMAL, Priority.CRITICAL]))
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded())
def test_every_shape_preempts_what_it_needs_and_no_more(scenario: tuple[Snapshot, Policy]) -> None:
    """Fractional and gang preemptors and victims (issue 16): never over-committed, only
    preemptible victims, quotas kept, no victim that was not needed (`check_victims_needed`)."""
    snap, policy = scenario
    plan = decide(snap, policy, now=NOW)
    check_every_job_accounted(snap, plan)
    check_no_overcommit(snap, plan)
    check_starts(snap, plan)
    check_preemptions(snap, policy, plan)


@st.composite
def repetitive(draw: st.DrawFn) -> tuple[Snapshot, Policy]:
    """Like `scenarios`, but most queued jobs copy one of a few requests (new ids, ages, some
    held back or aged), as at scale, where the scheduler answers repeats from earlier waits."""
    cluster = draw(nodes(max_nodes=6))
    runs = draw(running_jobs(cluster))
    templates = draw(requests(draw(st.integers(1, 5))))
    copies = draw(
        st.lists(
            st.tuples(
                st.sampled_from(templates),
                st.sampled_from([0.0, 1.0, 7.0]),
                st.sampled_from([None, None, None, NOW + 50, NOW - 50]),
                st.sampled_from([None, None, NOW - 5000]),
                st.sampled_from([None, None, None, None, 300.0, 20000.0]),  # another time limit
                st.sampled_from([None, None, None, None, *TEAMS]),  # another team
            ),
            max_size=60,
        )
    )
    queued = [
        replace(
            t,
            job_id=100 + k,
            submitted_at=t.submitted_at + dt,
            not_before=held,
            queued_at=entered,
            time_limit_s=limit or t.time_limit_s,
            team=team or t.team,
        )
        for k, (t, dt, held, entered, limit, team) in enumerate(copies)
    ]
    queued += draw(requests(draw(st.integers(0, 6)), first_id=50))
    usage = {t: draw(st.sampled_from([0.0, 100.0, 1e5])) for t in TEAMS}
    snap = Snapshot(cluster, runs, tuple(draw(st.permutations(queued))), usage)
    return snap, draw(policies())


class _EveryJobConsidered(_Cycle):
    share_waits = False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(repetitive())
def test_answering_repeated_requests_from_earlier_waits_changes_no_plan(scenario: tuple[Snapshot, Policy]) -> None:
    snap, policy = scenario
    fast = decide(snap, policy, now=NOW)
    slow = _EveryJobConsidered(snap, policy, NOW).run()
    assert fast.starts == slow.starts
    assert fast.preemptions == slow.preemptions
    assert list(fast.waiting.items()) == list(slow.waiting.items())  # the same waits, in the same order


@FAST
@given(scenarios())
def test_fits_says_whether_place_would_find_room(scenario: tuple[Snapshot, Policy]) -> None:
    snap, _ = scenario
    cap = Capacity(snap.nodes, snap.running)
    for j in snap.queued:
        for model in cap.model_memory:
            assert cap.fits(j, model) == (cap.place(j, model) is not None)


def _reference_order(queued: list[JobRequest], policy: Policy, usage: dict[str, float], starts: set[int]) -> list[int]:
    """The documented order, the slow way, for jobs none of which has aged: by class, each
    time the team with the lowest usage / share, then the oldest head job; a started job
    charges its team at once. Jobs held back come last."""
    level_of = {j.job_id: int(j.priority) if policy.priorities else 0 for j in queued}
    usage = dict(usage)
    by_age = sorted(queued, key=lambda j: (j.submitted_at, j.job_id))
    held = [j for j in by_age if j.not_before is not None and j.not_before > NOW]
    left = [j for j in by_age if j not in held]
    order: list[int] = []
    while left:
        top = max(level_of[j.job_id] for j in left)
        heads: dict[str, JobRequest] = {}
        for j in left:
            if level_of[j.job_id] == top:
                heads.setdefault(j.team, j)

        def rank(head: JobRequest) -> tuple[float, float, int]:
            ratio = usage.get(head.team, 0.0) / max(policy.share(head.team), 1e-9) if policy.fair_share else 0.0
            return (ratio, head.submitted_at, head.job_id)

        picked = min(heads.values(), key=rank)
        left.remove(picked)
        order.append(picked.job_id)
        if picked.job_id in starts:
            charge = picked.gpus * min(picked.time_limit_s or CHARGE_HORIZON_S, CHARGE_HORIZON_S)
            usage[picked.team] = usage.get(picked.team, 0.0) + charge
    return order + [j.job_id for j in held]


@FAST
@given(repetitive(), st.sets(st.integers(100, 160)))
def test_team_queues_follow_the_documented_order(scenario: tuple[Snapshot, Policy], starts: set[int]) -> None:
    snap, policy = scenario
    # Without aged jobs: their charges reach a team's place in line only once that team is
    # next popped (so it was before this fast path too), which the reference does not model.
    queued = [
        j
        for j in snap.queued
        if NOW - (j.submitted_at if j.queued_at is None else j.queued_at) < policy.starvation_age_s
    ]
    queues = TeamQueues(queued, policy, snap.usage, now=NOW)
    order = []
    while (j := queues.pop()) is not None:
        order.append(j.job_id)
        queues.done(j, started=j.job_id in starts)
    order += [j.job_id for j in queues.held]
    assert order == _reference_order(queued, policy, dict(snap.usage), starts)


# ---- guaranteed quota within one cycle ---------------------------------------------------------


@st.composite
def quota_demand(draw: st.DrawFn) -> tuple[Snapshot, Policy, int]:
    """Team q below its H100 quota asks for GPUs within it; the other teams borrow every other GPU."""
    cluster = draw(nodes(min_nodes=1, max_nodes=4))
    h100 = {n.name: [g.index for g in n.gpus if g.model == "H100"] for n in cluster}
    h100 = {k: v for k, v in h100.items() if v}
    assume(h100)
    runs: list[RunningJob] = []
    next_id = 1000
    q_used = 0
    for name, idxs in sorted(h100.items()):
        rest = list(idxs)
        while rest:
            k = draw(st.integers(1, len(rest)))
            take, rest = rest[:k], rest[k:]
            mine = draw(st.integers(0, 4)) == 0
            q_used += k if mine else 0
            runs.append(
                RunningJob(
                    next_id,
                    Allocation((NodeSlice(name, tuple(take)),)),
                    team="q" if mine else draw(st.sampled_from(["x", "y"])),
                    priority=draw(st.sampled_from([Priority.LOW, Priority.NORMAL, Priority.HIGH])),
                    started_at=draw(st.sampled_from([0.0, NOW - 100])),
                    time_limit_s=draw(st.sampled_from([None, 600.0, 86400.0])),
                )
            )
            next_id += 1
    # The job must fit on one node once the borrowers there are gone.
    room = {
        name: len(idxs)
        - sum(len(s.gpu_indices) for r in runs if r.team == "q" for s in r.allocation.slices if s.node == name)
        for name, idxs in h100.items()
    }
    best = max(room.values())
    assume(best >= 1)
    total = sum(len(v) for v in h100.values())
    quota = draw(st.integers(q_used + 1, max(q_used + 1, total)))
    k = draw(st.integers(1, min(best, quota - q_used)))
    demand = job(1).gpus(k).gpu_type("H100").team("q").priority(draw(st.sampled_from(list(Priority))))
    # Other teams' demand for other models only: competing H100 demand is the xfail below.
    others = draw(requests(draw(st.integers(0, 4)), first_id=2))
    others = [
        replace(o, team=draw(st.sampled_from(["x", "y"])), gpu_types=(draw(st.sampled_from(["A100", "L4"])),))
        for o in others
    ]
    policy = Policy(
        teams={"q": Team("q", quota={"H100": float(quota)}), "x": Team("x"), "y": Team("y")},
        preemption=Preemption(grace_period_s=30.0, min_runtime_s=draw(st.sampled_from([0.0, 60.0]))),
        fair_share=draw(st.booleans()),
        priorities=draw(st.booleans()),
        backfill=draw(st.booleans()),
    )
    usage = {"q": draw(st.sampled_from([0.0, 1e6])), "x": 0.0, "y": 0.0}
    return Snapshot(cluster, tuple(runs), (demand.build(), *others), usage), policy, 1


@FAST
@given(quota_demand())
def test_guaranteed_quota_is_honoured_within_one_cycle(scenario: tuple[Snapshot, Policy, int]) -> None:
    snap, policy, job_id = scenario
    plan = decide(snap, policy, now=NOW)
    started = {s.job_id for s in plan.starts}
    for_it = [p for p in plan.preemptions if p.for_job == job_id]
    assert job_id in started or for_it, f"job within quota neither started nor preempting: {plan.waiting[job_id]}"
    check_preemptions(snap, policy, plan)
    check_no_overcommit(snap, plan)


def test_guaranteed_quota_is_honoured_against_competing_demand_in_the_same_cycle() -> None:
    """One H100, borrowed by team x's low job; q (quota 1) and x (a normal job) both ask for it."""
    snap = Snapshot(
        (node("n0").gpus(1, "H100").build(),),
        (RunningJob(1000, Allocation((NodeSlice("n0", (0,)),)), team="x", priority=Priority.LOW),),
        (job(1).team("q").priority("low").at(1).build(), job(5).team("x").priority("normal").at(0).build()),
    )
    policy = Policy(teams={"q": Team("q", quota={"H100": 1.0}), "x": Team("x")})
    plan = decide(snap, policy, now=NOW)
    for_q = [p for p in plan.preemptions if p.for_job == 1]
    assert for_q or 1 in {s.job_id for s in plan.starts}, (plan.preemptions, plan.waiting[1])


# (was a strict xfail: guaranteed demand now goes before any borrower; a regression test since)


# ---- every feasible job eventually runs --------------------------------------------------------


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Cycles, set[int]]:
    """A small cluster and a stream of jobs sized to contend for it, arriving over the first hour."""
    cluster = draw(nodes(min_nodes=1, max_nodes=2))
    models = sorted({g.model for n in cluster for g in n.gpus})
    biggest = max(len(n.gpus) for n in cluster)
    jobs = []
    for jid in range(1, draw(st.integers(3, 12)) + 1):
        slot = draw(st.integers(0, 6))
        b = job(jid).team(draw(st.sampled_from(TEAMS))).at(slot * 300.0)
        # often later arrivals rank higher, so they find lower classes running and preempt them
        b.priority(Priority(min(3, slot // 2)) if draw(st.booleans()) else draw(st.sampled_from(list(Priority))))
        b.limit(draw(st.sampled_from([600.0, 1800.0, 3600.0, 7200.0])))
        size = draw(st.sampled_from([0.25, 0.5, 1, 2, max(1, biggest // 2), biggest, biggest, biggest + 1]))
        b.gpus(size)
        if draw(st.booleans()):
            b.gpu_types(*draw(st.lists(st.sampled_from(models), min_size=1, unique=True)))
        if size >= 2 and draw(st.integers(0, 4)) == 0:
            b.gpus(2 * int(size)).nodes(2)
        jobs.append(b.build())
    policy = draw(policies())
    if draw(st.booleans()):  # half the runs: priority preemption on, no quotas, so jobs get preempted and requeued
        policy = replace(
            policy,
            teams={t: Team(t, weight=policy.team(t).weight) for t in TEAMS},
            priorities=True,
            preemption=replace(policy.preemption, enabled=True, min_runtime_s=draw(st.sampled_from([0.0, 60.0]))),
        )
    sim = Cycles(cluster, policy, jobs, exit_after_term_s=min(5.0, policy.preemption.grace_period_s))
    # Jobs that fit the nodes but never their team's quota cannot run (they wait with reason quota):
    # leave them out; jobs that fit no nodes stay, as noise that must not block anyone.
    jobs = [j for j in jobs if sim.feasible(j) or not sim.fits(j)]
    sim = Cycles(cluster, policy, jobs, exit_after_term_s=min(5.0, policy.preemption.grace_period_s))
    for j in jobs:  # some jobs end before their limit
        if draw(st.booleans()):
            sim.runtime[j.job_id] = draw(st.sampled_from([10.0, 200.0]))
    return sim, {j.job_id for j in jobs if sim.feasible(j)}


@SLOW
@given(workloads())
def test_every_feasible_job_eventually_runs(workload: tuple[Cycles, set[int]]) -> None:
    sim, feasible = workload
    bound = 40 * (len(feasible) + 1) + 50  # cycles: every start, end, arrival and age step is an event
    done = sim.run(bound, until=feasible, max_step=900.0)
    left = feasible - set(sim.finished)
    waits = {j: sim.last_plan.waiting.get(j) for j in left} if sim.last_plan else {}
    assert done, f"after {sim.plans} cycles ({sim.now:.0f} s) jobs {sorted(left)} never finished: {waits}"
    assert set(sim.first_start) >= feasible
    for t, victim, for_job in sim.preemptions:
        assert victim != for_job and t <= sim.now


# ---- no preemption livelock (issue 14) ----------------------------------------------------------


def check_no_repeated_preemption(sim: Cycles) -> None:
    """No job is preempted twice in a row for the same job while that job never started between:
    the demand that stopped it once must have been met (or gone) before it may stop it again."""
    last: dict[int, tuple[float, int]] = {}  # victim -> (when, for which job) it was last preempted
    starts = sorted(sim.start_log)
    for t, victim, for_job in sorted(sim.preemptions):
        before = last.get(victim)
        if before is not None and before[1] == for_job:
            started_between = any(before[0] <= st_t <= t and jid == for_job for st_t, jid in starts)
            assert started_between, (
                f"job {victim} preempted at {before[0]:.0f} and again at {t:.0f} for job {for_job}, "
                f"which never started in between"
            )
        last[victim] = (t, for_job)


@st.composite
def contended(draw: st.DrawFn) -> Cycles:
    """Two teams holding their quotas of a small cluster with long jobs, a third team without a
    quota, and later jobs of higher classes (of all teams) that can only start by preempting:
    jobs of every shape (shares of a GPU, whole GPUs, on two nodes a gang over both)."""
    size = draw(st.integers(2, 6))
    two = draw(st.booleans())
    cluster = tuple(node(f"n{i}").gpus(size).build() for i in range(2 if two else 1))
    qa = draw(st.integers(1, size - 1))
    qb = draw(st.integers(0, size - qa))
    policy = Policy(
        teams={"a": Team("a", quota={"H100": float(qa)}), "b": Team("b", quota={"H100": float(qb)}), "c": Team("c")},
        preemption=Preemption(
            grace_period_s=draw(st.sampled_from([0.0, 30.0])),
            protected_classes=frozenset(draw(st.sampled_from([{Priority.CRITICAL}, set()]))),
            reclaim_quota=draw(st.booleans()),
        ),
        fair_share=draw(st.booleans()),
    )
    jobs = []
    for jid in range(1, draw(st.integers(2, 8)) + 1):
        early = draw(st.booleans())
        b = job(jid).team(draw(st.sampled_from(TEAMS))).at(0.0 if early else draw(st.sampled_from([100.0, 400.0])))
        b.priority(draw(st.sampled_from(list(Priority) if not early else [Priority.LOW, Priority.NORMAL])))
        b.gpus(draw(st.sampled_from([0.25, 0.5, 1, 1, 2, size]))).limit(draw(st.sampled_from([600.0, 50_000.0])))
        if two and draw(st.integers(0, 3)) == 0:
            b.gpus(2 * draw(st.integers(1, size))).nodes(2)
        jobs.append(b.build())
    sim = Cycles(cluster, policy, jobs, exit_after_term_s=min(5.0, policy.preemption.grace_period_s))
    for j in jobs:
        if draw(st.booleans()):
            sim.runtime[j.job_id] = draw(st.sampled_from([50.0, 500.0]))
    return sim


@SLOW
@given(contended())
def test_no_job_is_preempted_twice_in_a_row_for_the_same_unmet_demand(sim: Cycles) -> None:
    sim.run(120, max_step=60.0)
    check_no_repeated_preemption(sim)


def _two_teams_at_their_quotas(preempted_for: bool = True) -> Cycles:
    """The measured livelock: teams a and b each hold their 1-GPU quota of a 2-GPU node (a's job
    is critical, so never preempted); a's high job arrives and b's job is the only lower one."""
    policy = Policy(
        teams={"a": Team("a", quota={"H100": 1.0}), "b": Team("b", quota={"H100": 1.0})},
        preemption=Preemption(grace_period_s=30.0),
    )
    jobs = [
        job(1).team("a").priority("critical").at(0).limit(1000).build(),
        job(2).team("b").at(0).limit(100_000).build(),
        job(3).team("a").priority("high").at(100).limit(600).build(),
    ]
    return Cycles((node("n1").gpus(2).build(),), policy, jobs)


def test_a_team_over_its_guarantee_does_not_preempt_another_teams_guaranteed_job() -> None:
    sim = _two_teams_at_their_quotas()
    assert sim.run(200, until=[3], max_step=60.0)
    assert sim.preemptions == [], "b's job is within b's guarantee; a, at its own, may not take it"
    assert sim.first_start[3] == 1000.0  # a's high job starts when a's critical job ends
    assert sim.starts[2] == 1


def test_a_preempted_job_is_considered_after_the_job_it_was_preempted_for() -> None:
    """b (quota 2) borrows a third GPU; a's high job needs 2 and preempted b's borrowed job 12,
    and b's job 11 ended meanwhile: back in line, job 12 is within b's guarantee and would go
    first, taking one of the two free GPUs back."""
    policy = Policy(teams={"a": Team("a"), "b": Team("b", quota={"H100": 2.0})})
    nodes = (node("n1").gpus(3).build(),)
    victim = job(12).team("b").at(0).build()
    high = job(3).team("a").priority("high").gpus(2).at(100).build()
    running = (RunningJob(10, Allocation((NodeSlice("n1", (0,)),)), team="b"),)
    snap = Snapshot(nodes, running, (replace(victim, queued_at=105.0), high))
    assert {s.job_id for s in decide(snap, policy, now=105.0).starts} == {12}  # the order alone
    snap = replace(snap, preempted_for={12: 3})
    plan = decide(snap, policy, now=105.0)
    assert [s.job_id for s in plan.starts] == [3]
    assert plan.waiting[12].reason in (WaitReason.RESOURCES, WaitReason.RESERVED, WaitReason.BEHIND_RESERVATION)


def test_a_preempted_job_is_held_for_no_job_that_left_the_queue() -> None:
    policy = Policy(teams={"b": Team("b", quota={"H100": 2.0})})
    snap = Snapshot((node("n1").gpus(1).build(),), (), (job(12).team("b").build(),), preempted_for={12: 3})
    assert [s.job_id for s in decide(snap, policy, now=10.0).starts] == [12]


def test_a_preempted_job_that_is_older_than_the_starvation_age_does_not_livelock() -> None:
    """The default policy; a low job submitted long ago runs; a day later a high job needs its node."""
    old = job(1).priority("low").at(0).limit(200_000).build()
    high = job(2).gpus(2).priority("high").at(90_000).limit(600).build()
    sim = Cycles((node("n1").gpus(2).build(),), Policy(), [old, high])
    sim.run(100, until=[2], max_step=3600)
    assert 2 in sim.first_start, f"{len(sim.preemptions)} preemptions of job 1, job 2 still waits at t={sim.now:.0f}"
    assert len(sim.preemptions) == 1


def test_a_whole_gpu_job_is_not_starved_by_a_stream_of_fractional_jobs() -> None:
    """One GPU, a stream of half-GPU jobs that always overlap: the whole-GPU job must start once aged."""
    stream = [job(i).gpus(0.5).at(50.0 * (i - 10)).limit(100).build() for i in range(10, 10 + 200)]
    whole = job(1).at(10.0).limit(100).build()
    sim = Cycles((node("n1").gpus(1).build(),), Policy(starvation_age_s=3600), [whole, *stream])
    sim.run(120, until=[1], max_step=50)
    assert 1 in sim.first_start, f"still waiting at t={sim.now:.0f}: {sim.last_plan and sim.last_plan.waiting[1]}"
    assert sim.first_start[1] <= 10.0 + 3600 + 100


@pytest.mark.parametrize("make", [Policy, fifo_policy, priority_policy], ids=["default", "fifo", "priority"])
def test_a_big_job_is_not_starved_by_a_stream_of_small_ones(make: object) -> None:
    """Two 4-GPU nodes kept busy by 1-GPU jobs arriving all the time: the 8-GPU job still runs."""
    stream = [job(i).gpus(1).at(20.0 * (i - 10)).limit(150).build() for i in range(10, 10 + 300)]
    big = job(1).gpus(8).at(5.0).limit(100).build()
    policy = make()  # type: ignore[operator]
    sim = Cycles((node("a").gpus(4).build(), node("b").gpus(4).build()), policy, [big, *stream])
    assert sim.run(500, until=[1], max_step=20)
    assert sim.first_start[1] <= 5.0 + policy.starvation_age_s


def test_a_waiting_preemptor_goes_first_even_when_the_order_changed_under_it() -> None:
    """Found by the property test above: within its team's quota a low job outranks the team's
    borrowing normal job, yet the normal 2-GPU job was first in line when it preempted two low
    jobs of its own team; the next cycle a third low job (within the quota) and a victim took the
    freed GPUs, and the normal job preempted them again. Its preemptor now goes first."""
    policy = Policy(
        teams={"a": Team("a", quota={"H100": 1.0}), "b": Team("b", quota={"H100": 0.0})},
        preemption=Preemption(grace_period_s=0.0),
        fair_share=False,
    )
    jobs = [job(j).team("a").priority("low").at(0).limit(600).build() for j in (1, 4, 6)]
    jobs.append(job(7).team("a").gpus(2).at(0).limit(600).build())
    sim = Cycles((node("n0").gpus(2).build(),), policy, jobs, exit_after_term_s=0.0)
    sim.run(6, max_step=60.0)
    assert sim.preemptions == [(60.0, 1, 7), (60.0, 4, 7)]
    assert (61.0, 7) in sim.start_log
    check_no_repeated_preemption(sim)
