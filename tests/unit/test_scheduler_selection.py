"""Node selection in the core (issue 16): --nodelist, --exclude, --constraint and --exclusive
honoured by placement, backfill reservations and preemption; waits that name the selection;
answers never shared between jobs with different selections; and properties over random
clusters with labels (never outside the selection, exclusive never shares, never over-committed)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucluster.core.capacity_index import CapacityIndex
from gpucluster.core.policy import Policy, Preemption
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.selection import Selection, parse_constraint
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, JobRequest, Node, NodeSlice, Plan, RunningJob
from gpucluster.waits_text import sentence

from .builders import job, node, running, shared, snapshot
from .test_scheduler_properties import (
    NOW,
    check_every_job_accounted,
    check_no_overcommit,
    check_starts,
    policies,
    requests,
    running_jobs,
)
from .test_scheduler_properties import nodes as random_nodes

PRIORITY = Policy(preemption=Preemption(enabled=True, grace_period_s=30.0, min_runtime_s=0.0))


def _nodes_of(plan: Plan, job_id: int) -> set[str]:
    (start,) = [s for s in plan.starts if s.job_id == job_id]
    return {s.node for s in start.allocation.slices}


def test_a_constraint_places_only_on_nodes_with_the_label() -> None:
    # Best fit alone would take n1 (the fewest free GPUs left); only n2 has the label.
    snap = snapshot(
        nodes=[node("n1").gpus(2), node("n2").gpus(8).labels("ib", "rack=r1")],
        queued=[job(1).gpus(2).select(constraint="ib")],
    )
    assert _nodes_of(decide(snap), 1) == {"n2"}


def test_key_value_labels_all_of_and_any_of() -> None:
    cluster = [
        node("a").gpus(2).labels("ib", "rack=r1"),
        node("b").gpus(2).labels("ib", "rack=r2"),
        node("c").gpus(2).labels("nvswitch"),
    ]
    snap = snapshot(
        nodes=cluster,
        queued=[
            job(1).gpus(2).select(constraint="ib&rack=r2"),
            job(2).gpus(2).select(constraint="rack=r9|nvswitch"),
            job(3).gpus(2).select(constraint="rack=r1"),
        ],
    )
    plan = decide(snap)
    assert (_nodes_of(plan, 1), _nodes_of(plan, 2), _nodes_of(plan, 3)) == ({"b"}, {"c"}, {"a"})


def test_nodelist_and_exclude() -> None:
    cluster = [node(f"n{i}").gpus(4) for i in range(1, 5)]
    snap = snapshot(
        nodes=cluster,
        queued=[job(1).gpus(4).select(nodelist=["n3"]), job(2).gpus(4).select(exclude=["n1", "n2"])],
    )
    plan = decide(snap)
    assert _nodes_of(plan, 1) == {"n3"}
    assert _nodes_of(plan, 2) == {"n4"}


def test_a_job_spanning_nodes_stays_inside_its_selection() -> None:
    cluster = [node(f"n{i}").gpus(4).labels(*(["ib"] if i % 2 else [])) for i in range(6)]
    snap = snapshot(nodes=cluster, queued=[job(1).gpus(8).select(constraint="ib"), job(2).gpus(8).nodes(2)])
    plan = decide(snap)
    assert _nodes_of(plan, 1) <= {"n1", "n3", "n5"}
    assert len(_nodes_of(plan, 1)) == 2


def test_the_wait_names_the_selection_and_how_many_nodes_match() -> None:
    # Job 0 is first in line for H100s (it holds the model's reservation); job 1's ib nodes are
    # busy while 8 GPUs are free on n1, which has no ib.
    snap = snapshot(
        nodes=[node("n1").gpus(8), node("n2").gpus(2).labels("ib"), node("n3").gpus(2).labels("ib")],
        running=[running(90, "n2", 0), running(91, "n3", 0, 1)],
        queued=[job(0).gpus(2).select(nodelist=["n2"]), job(1).gpus(2).select(constraint="ib")],
    )
    plan = decide(snap)
    assert not plan.starts
    assert plan.waiting[0].reason is WaitReason.RESERVED and "on n2" in sentence(plan.waiting[0])
    wait = plan.waiting[1]
    assert wait.reason is WaitReason.RESOURCES
    assert sentence(wait) == (
        "no free node matches --constraint ib: 2 node(s) with H100 GPUs match, 2 of them busy; "
        "needs 2 free H100 GPU(s), at most 1 free on one"
    )


def test_no_matching_node_is_no_fit_naming_the_nodes_labels() -> None:
    snap = snapshot(
        nodes=[node("n1").gpus(8).labels("rack=r1"), node("n2").gpus(8)],
        queued=[job(1).gpus(1).select(constraint="ib")],
    )
    wait = decide(snap).waiting[1]
    assert wait.reason is WaitReason.NO_FIT
    assert sentence(wait) == "no node matches --constraint ib (nodes and their labels: n1: rack=r1; n2: no labels)"


def test_matching_nodes_too_small_is_no_fit() -> None:
    snap = snapshot(
        nodes=[node("n1").gpus(8), node("n2").gpus(2).labels("ib")],
        queued=[job(1).gpus(4).select(constraint="ib")],
    )
    wait = decide(snap).waiting[1]
    assert wait.reason is WaitReason.NO_FIT
    assert "the 1 node(s) matching --constraint ib can never host 4 GPUs" in sentence(wait)


def test_jobs_asking_the_same_but_with_other_selections_do_not_share_an_answer() -> None:
    # Job 1 waits (its only node is busy); job 2 asks the same GPUs on another node and starts.
    snap = snapshot(
        nodes=[node("n1").gpus(2), node("n2").gpus(2)],
        running=[running(90, "n1", 0)],
        queued=[job(1).gpus(2).select(nodelist=["n1"]), job(2).gpus(2).select(nodelist=["n2"])],
    )
    for reasons in (True, False):
        plan = decide(snap, Policy(backfill=True), now=NOW, reasons=reasons)
        assert [s.job_id for s in plan.starts] == [2]
        assert _nodes_of(plan, 2) == {"n2"}


def test_demand_and_need_include_the_selection() -> None:
    a, b = job(1).gpus(2).build(), job(2).gpus(2).select(constraint="ib").build()
    assert a.need != b.need and a.demand != b.demand
    assert b.need == job(3).gpus(2).select(constraint="ib").build().need


# ---- exclusive --------------------------------------------------------------------------------


def test_an_exclusive_job_starts_only_on_a_node_where_nothing_runs() -> None:
    snap = snapshot(
        nodes=[node("n1").gpus(8), node("n2").gpus(8)],
        running=[shared(90, "n1", 0, 0.25)],
        queued=[job(1).gpus(1).exclusive()],
    )
    assert _nodes_of(decide(snap), 1) == {"n2"}


def test_nothing_else_lands_on_an_exclusive_jobs_node_in_the_same_cycle_or_later() -> None:
    cluster = [node("n1").gpus(8), node("n2").gpus(8)]
    snap = snapshot(nodes=cluster, queued=[job(1).gpus(1).exclusive(), job(2).gpus(4), job(3).gpus(4), job(4).gpus(1)])
    plan = decide(snap)
    excl = _nodes_of(plan, 1)
    others = {n for s in plan.starts if s.job_id != 1 for n in {sl.node for sl in s.allocation.slices}}
    assert not excl & others
    assert {s.job_id for s in plan.starts} == {1, 2, 3}  # 4 waits: n1's other 7 GPUs are held
    # Later cycles: the running exclusive job keeps its node's 7 other GPUs from everyone.
    (start,) = [s for s in plan.starts if s.job_id == 1]
    later = snapshot(
        nodes=cluster,
        running=[RunningJob(1, start.allocation, exclusive=True)],
        queued=[job(5).gpus(1), job(6).gpus(0.5)],
    )
    plan2 = decide(later)
    assert all(sl.node not in excl for s in plan2.starts for sl in s.allocation.slices)


def test_an_exclusive_job_waits_for_an_idle_node_and_says_so() -> None:
    # The running job is of a higher class: it may not be preempted (tests/unit/test_preempt_selection.py
    # has an exclusive job preempting lower ones).
    snap = snapshot(
        nodes=[node("n1").gpus(8)],
        running=[running(90, "n1", 0, priority="critical")],
        queued=[job(1).gpus(1).exclusive().priority("high")],
    )
    plan = decide(snap, PRIORITY, now=NOW)
    assert not plan.starts and not plan.preemptions
    # First in line, it holds a reservation on the node from when it empties.
    assert plan.waiting[1].reason is WaitReason.RESERVED and "--exclusive" in sentence(plan.waiting[1])
    # Without backfill reservations... behind one, it says why it waits.
    behind = snapshot(
        nodes=[node("n1").gpus(8)],
        running=[running(90, "n1", 0, priority="critical")],
        queued=[job(2).gpus(8).priority("critical"), job(1).gpus(1).exclusive().priority("high")],
    )
    plan = decide(behind, PRIORITY, now=NOW)
    assert "an exclusive job needs nodes where nothing runs" in sentence(plan.waiting[1]), plan.waiting[1]


@pytest.mark.parametrize("told", [False, True])
def test_a_kept_index_holds_an_exclusive_jobs_node_like_a_fresh_build(told: bool) -> None:
    cluster = tuple(node(f"n{i}").gpus(4).build() for i in range(3))
    index = CapacityIndex(told=told)
    excl = RunningJob(1, Allocation((NodeSlice("n0", (0,)),)), exclusive=True)
    other = running(2, "n1", 0, 1)
    queue = (job(3).gpus(4).build(), job(4).gpus(3).build(), job(5).gpus(1).build())
    for step, runs in enumerate([(), (excl,), (excl, other), (other,), ()]):
        if told:
            before = {j.job_id for j in ([], [excl], [excl, other], [other], [])[step - 1]} if step else set()
            for j in runs:
                if j.job_id not in before:
                    index.add(j)
            for jid in before - {j.job_id for j in runs}:
                index.remove(excl if jid == 1 else other)
        snap = Snapshot(cluster, runs, queue)
        kept = decide(replace(snap, capacity=index))
        fresh = decide(snap)
        assert kept.starts == fresh.starts, step
        if excl in runs:
            assert all(sl.node != "n0" for s in kept.starts for sl in s.allocation.slices)


# ---- preemption and reservations ----------------------------------------------------------------


def test_preemption_takes_victims_only_on_allowed_nodes() -> None:
    # The cheapest victim (the lowest class, least work) runs on n1, which has no ib: the
    # preemptor must stop the one on n2 instead.
    snap = snapshot(
        nodes=[node("n1").gpus(2), node("n2").gpus(2).labels("ib")],
        running=[
            running(90, "n1", 0, 1, priority="low", started_at=NOW - 10),
            running(91, "n2", 0, 1, priority="normal", started_at=NOW - 5000),
        ],
        queued=[job(1).gpus(2).priority("high").select(constraint="ib")],
    )
    plan = decide(snap, PRIORITY, now=NOW)
    assert [p.job_id for p in plan.preemptions] == [91]


def test_no_preemption_when_no_allowed_node_holds_a_victim() -> None:
    snap = snapshot(
        nodes=[node("n1").gpus(2), node("n2").gpus(2).labels("ib")],
        running=[running(90, "n1", 0, 1, priority="low"), running(91, "n2", 0, 1, priority="critical")],
        queued=[job(1).gpus(2).priority("high").select(constraint="ib")],
    )
    plan = decide(snap, PRIORITY, now=NOW)
    assert not plan.preemptions


def test_a_reservation_holds_only_allowed_nodes_and_others_backfill_elsewhere() -> None:
    snap = snapshot(
        nodes=[node("n1").gpus(4), node("n2").gpus(4).labels("ib")],
        running=[
            running(90, "n1", 0, 1, 2, 3, started_at=NOW, limit=100),
            running(91, "n2", 0, 1, started_at=NOW, limit=50),
        ],
        queued=[job(1).gpus(4).select(constraint="ib"), job(2).gpus(2).limit(10_000)],
    )
    plan = decide(snap, Policy(backfill=True, default_time_limit_s=3600), now=NOW)
    wait = plan.waiting[1]
    assert wait.reason is WaitReason.RESERVED and "on n2" in sentence(wait)
    assert wait.estimated_start == NOW + 50
    # Job 2 would delay job 1 on n2 (it outlasts the shadow), and n1 is full: it waits.
    assert plan.waiting[2].reason is WaitReason.BEHIND_RESERVATION


def test_a_multi_node_reservation_counts_only_allowed_nodes_ends() -> None:
    # n0 frees first (t+10) but has no ib; the ib nodes free at t+100 and t+200.
    cluster = [node("n0").gpus(4), node("n1").gpus(4).labels("ib"), node("n2").gpus(4).labels("ib")]
    snap = snapshot(
        nodes=cluster,
        running=[
            running(90, "n0", 0, 1, 2, 3, started_at=NOW, limit=10),
            running(91, "n1", 0, 1, 2, 3, started_at=NOW, limit=100),
            running(92, "n2", 0, 1, 2, 3, started_at=NOW, limit=200),
        ],
        queued=[job(1).gpus(8).select(constraint="ib")],
    )
    wait = decide(snap, Policy(backfill=True), now=NOW).waiting[1]
    assert wait.reason is WaitReason.RESERVED and wait.estimated_start == NOW + 200


# ---- properties -----------------------------------------------------------------------------------

LABELS = ("ib", "rack=r1", "rack=r2", "nvswitch")


@st.composite
def labelled(draw: st.DrawFn) -> tuple[Snapshot, Policy]:
    cluster = tuple(
        replace(n, labels=frozenset(draw(st.lists(st.sampled_from(LABELS), unique=True, max_size=2))))
        for n in draw(random_nodes(max_nodes=6))
    )
    runs = list(draw(running_jobs(cluster)))
    # Some running jobs hold their nodes alone: drop any other job sharing a node with them.
    excl = {j.job_id for j in runs if len(j.allocation.slices) == 1 and j.allocation.slices[0].share >= 1}
    excl = {jid for jid in excl if draw(st.integers(0, 3)) == 0}
    taken: set[str] = set()
    kept: list[RunningJob] = []
    for j in sorted(runs, key=lambda r: r.job_id not in excl):
        names = {s.node for s in j.allocation.slices}
        if names & taken:
            continue
        if j.job_id in excl:
            if any(names & {s.node for s in o.allocation.slices} for o in kept):
                continue
            taken |= names
            j = replace(j, exclusive=True)
        kept.append(j)
    queued = draw(requests(draw(st.integers(0, 12))))
    names = sorted(n.name for n in cluster)
    out = []
    for q in queued:
        kind = draw(st.sampled_from(["none", "none", "constraint", "nodelist", "exclude", "exclusive"]))
        sel: Selection | None = None
        if kind == "constraint":
            groups = draw(st.lists(st.lists(st.sampled_from(LABELS), min_size=1, max_size=2), min_size=1, max_size=2))
            sel = Selection(constraint=parse_constraint("|".join("&".join(g) for g in groups)))
        elif kind == "nodelist":
            sel = Selection(nodelist=frozenset(draw(st.lists(st.sampled_from(names), min_size=1, max_size=3))))
        elif kind == "exclude":
            sel = Selection(exclude=frozenset(draw(st.lists(st.sampled_from(names), min_size=1, max_size=3))))
        elif kind == "exclusive" and not q.fractional:
            sel = Selection(exclusive=True)
        out.append(replace(q, selection=sel))
    return Snapshot(cluster, tuple(kept), tuple(draw(st.permutations(out)))), draw(policies())


def check_selection(snap: Snapshot, plan: Plan) -> None:
    labels = {n.name: n.labels for n in snap.nodes}
    queued: dict[int, JobRequest] = {j.job_id: j for j in snap.queued}
    holders: dict[str, set[int]] = {}
    exclusive: set[int] = set()
    for r in snap.running:
        for s in r.allocation.slices:
            holders.setdefault(s.node, set()).add(r.job_id)
        if r.exclusive:
            exclusive.add(r.job_id)
    for st_ in plan.starts:
        sel = queued[st_.job_id].selection
        for s in st_.allocation.slices:
            assert sel is None or sel.allows(s.node, labels[s.node]), f"job {st_.job_id} placed on {s.node}"
            holders.setdefault(s.node, set()).add(st_.job_id)
        if sel is not None and sel.exclusive:
            exclusive.add(st_.job_id)
    for node_name, jobs in holders.items():
        if jobs & exclusive:
            assert len(jobs) == 1, f"node {node_name} shared by {sorted(jobs)}, exclusive: {sorted(jobs & exclusive)}"


SEL = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SEL
@given(labelled())
def test_starts_stay_inside_selections_and_exclusive_never_shares(scenario: tuple[Snapshot, Policy]) -> None:
    snap, policy = scenario
    plan = decide(snap, policy, now=NOW)
    check_every_job_accounted(snap, plan)
    check_no_overcommit(snap, plan)
    check_starts(snap, plan)
    check_selection(snap, plan)
    allowed_victims = {j.job_id: j for j in snap.queued}
    labels = {n.name: n.labels for n in snap.nodes}
    running = {r.job_id: r for r in snap.running}
    for p in plan.preemptions:
        sel = allowed_victims[p.for_job].selection
        if sel is not None and sel.filters:  # an exclusive job alone may take victims anywhere
            assert any(sel.allows(s.node, labels[s.node]) for s in running[p.job_id].allocation.slices)
    # An exclusive preemptor empties whole nodes: on every node its victims leave, nothing of a
    # class it may not take stays (each other job there is a victim, or already stopping).
    victims_of: dict[int, set[int]] = {}
    for p in plan.preemptions:
        victims_of.setdefault(p.for_job, set()).add(p.job_id)
    for preemptor, victims in victims_of.items():
        sel = allowed_victims[preemptor].selection
        if sel is None or not sel.exclusive or len(victims) != sum(1 for v in victims if v in running):
            continue
        nodes = {s.node for v in victims for s in running[v].allocation.slices}
        emptied = [
            nd
            for nd in nodes
            if all(
                r.job_id in victims or r.stopping
                for r in snap.running
                if any(s.node == nd for s in r.allocation.slices)
            )
        ]
        assert emptied, f"exclusive job {preemptor} stops {sorted(victims)} but empties none of {sorted(nodes)}"
    # The shortcut for the simulator gives the same starts and preemptions.
    quick = decide(snap, policy, now=NOW, reasons=False)
    assert (quick.starts, quick.preemptions) == (plan.starts, plan.preemptions)


@SEL
@given(labelled())
def test_a_kept_index_gives_the_same_plan_with_exclusive_jobs_running(scenario: tuple[Snapshot, Policy]) -> None:
    snap, policy = scenario
    index = CapacityIndex()
    decide(replace(snap, running=()), policy, now=NOW)  # an earlier cycle with nothing running
    decide(replace(snap, running=(), capacity=index), policy, now=NOW)
    kept = decide(replace(snap, capacity=index), policy, now=NOW)
    assert kept == decide(snap, policy, now=NOW)


def test_defaults_select_nothing() -> None:
    assert Node("n", ()).labels == frozenset()
    assert RunningJob(1, Allocation(())).exclusive is False
    assert job(1).build().selection is None
