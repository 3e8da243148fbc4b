"""Node pools (issue 16): nodes only some teams or classes may use, from the policy's `pools:`,
enforced by `decide` for placement, preemption and waits; read from policy files with errors
that name the line; refused at submit when they leave a job no node."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucluster.core.policy import Policy, Preemption
from gpucluster.core.pools import Pool, closed_nodes
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Plan, Priority
from gpucluster.head.policy_source import PolicySource
from gpucluster.head.service import Rejected
from gpucluster.policyfile import PolicyFileError, load_policy
from gpucluster.waits_text import sentence

from .builders import NodeBuilder, job, node, running, snapshot
from .headkit import api_client, make_cluster
from .test_scheduler_properties import NOW, TEAMS, check_every_job_accounted, check_no_overcommit, check_starts
from .test_scheduler_selection import labelled

IB_FOR_VISION = Pool("ib", labels=frozenset({"ib"}), teams=frozenset({"vision"}))


def _nodes_of(plan: Plan, job_id: int) -> set[str]:
    (start,) = [s for s in plan.starts if s.job_id == job_id]
    return {s.node for s in start.allocation.slices}


def cluster() -> list[NodeBuilder]:
    return [node("n1").gpus(4).labels("ib"), node("n2").gpus(4)]


def test_a_pool_keeps_other_teams_off_its_nodes() -> None:
    snap = snapshot(nodes=cluster(), queued=[job(1).gpus(4).team("nlp"), job(2).gpus(4).team("vision")])
    plan = decide(snap, Policy(pools=(IB_FOR_VISION,)))
    assert _nodes_of(plan, 1) == {"n2"} and _nodes_of(plan, 2) == {"n1"}


def test_a_pool_open_to_some_classes_only() -> None:
    pool = Pool("fast", nodes=frozenset({"n1"}), classes=frozenset({Priority.HIGH, Priority.CRITICAL}))
    snap = snapshot(
        nodes=cluster(), queued=[job(1).gpus(4).priority("normal"), job(2).gpus(4).priority("normal").at(3)]
    )
    plan = decide(snap, Policy(pools=(pool,)), now=NOW)
    assert [s.job_id for s in plan.starts] == [1] and _nodes_of(plan, 1) == {"n2"}
    wait = plan.waiting[2]
    assert wait.reason is not WaitReason.NO_FIT  # n2 comes back: it waits for it
    high = decide(snapshot(nodes=cluster(), queued=[job(3).gpus(8).priority("high")]), Policy(pools=(pool,)))
    assert _nodes_of(high, 3) == {"n1", "n2"}  # a high job may use both


def test_the_wait_names_the_closed_pool_and_no_node_at_all_is_no_fit() -> None:
    snap = snapshot(
        nodes=cluster(),
        running=[running(90, "n2", 0, 1, 2, 3, team="vision")],
        queued=[job(0).gpus(4).team("x").at(0), job(1).gpus(1).team("nlp")],
    )
    plan = decide(snap, Policy(pools=(IB_FOR_VISION,)), now=NOW)
    wait = plan.waiting[1]
    assert wait.reason is WaitReason.RESOURCES
    assert sentence(wait).startswith("no free node matches outside pool(s) ib (closed to its team or class): 1 node(s)")
    closed_all = Pool("all", nodes=frozenset({"n1", "n2"}), teams=frozenset({"vision"}))
    none = decide(snapshot(nodes=cluster(), queued=[job(1).team("nlp")]), Policy(pools=(closed_all,)))
    assert none.waiting[1].reason is WaitReason.NO_FIT and "pool(s) all" in sentence(none.waiting[1])


def test_a_node_in_two_pools_is_open_to_whoever_either_admits() -> None:
    pools = (IB_FOR_VISION, Pool("shared", nodes=frozenset({"n1"}), teams=frozenset({"nlp"})))
    nodes = [n.build() for n in cluster()]
    assert closed_nodes(pools, nodes, "nlp", Priority.NORMAL).denied == frozenset()
    assert closed_nodes(pools, nodes, "other", Priority.NORMAL).denied == frozenset({"n1"})


def test_preemption_for_a_pooled_job_stops_only_jobs_on_nodes_open_to_it() -> None:
    # The cheapest victim (least work lost) runs on n1, in vision's pool: an nlp job may not
    # use n1, so it stops the job on n2.
    snap = snapshot(
        nodes=cluster(),
        running=[
            running(90, "n1", 0, 1, 2, 3, priority="low", started_at=NOW - 10),
            running(91, "n2", 0, 1, 2, 3, priority="low", started_at=NOW - 5000),
        ],
        queued=[job(1).gpus(4).team("nlp").priority("high")],
    )
    policy = Policy(pools=(IB_FOR_VISION,), preemption=Preemption(min_runtime_s=0.0))
    assert [p.job_id for p in decide(snap, policy, now=NOW).preemptions] == [91]


@st.composite
def pooled(draw: st.DrawFn) -> tuple[Snapshot, Policy]:
    snap, policy = draw(labelled())
    names = sorted(n.name for n in snap.nodes)
    pools = []
    for i in range(draw(st.integers(1, 3))):
        pools.append(
            Pool(
                f"p{i}",
                nodes=frozenset(draw(st.lists(st.sampled_from(names), max_size=3))),
                labels=frozenset(draw(st.lists(st.sampled_from(["ib", "nvswitch"]), max_size=1))),
                teams=frozenset(draw(st.lists(st.sampled_from(TEAMS), max_size=2))) if draw(st.booleans()) else None,
                classes=frozenset(draw(st.lists(st.sampled_from(list(Priority)), min_size=1, max_size=2)))
                if draw(st.booleans())
                else None,
            )
        )
    return snap, replace(policy, pools=tuple(pools))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pooled())
def test_no_job_ever_starts_on_a_node_its_pools_close_to_it(scenario: tuple[Snapshot, Policy]) -> None:
    snap, policy = scenario
    plan = decide(snap, policy, now=NOW)
    check_every_job_accounted(snap, plan)
    check_no_overcommit(snap, plan)
    check_starts(snap, plan)
    queued = {j.job_id: j for j in snap.queued}
    for s in plan.starts:
        j = queued[s.job_id]
        closed = closed_nodes(policy.pools, snap.nodes, j.team, j.priority).denied
        assert not {sl.node for sl in s.allocation.slices} & closed, (j, closed)
    for p in plan.preemptions:
        j = queued[p.for_job]
        closed = closed_nodes(policy.pools, snap.nodes, j.team, j.priority).denied
        victim = next(r for r in snap.running if r.job_id == p.job_id)
        assert {sl.node for sl in victim.allocation.slices} - closed


# ---- the policy file and the head ---------------------------------------------------------------


def test_pools_in_a_policy_file(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(
        "teams: {vision: {}, nlp: {}}\n"
        "pools:\n"
        "  ib: {labels: [ib], teams: [vision], classes: [high, critical]}\n"
        "  spare: {nodes: [n9]}\n"
    )
    policy = load_policy(f)
    assert policy.pools == (
        Pool(
            "ib",
            labels=frozenset({"ib"}),
            teams=frozenset({"vision"}),
            classes=frozenset({Priority.HIGH, Priority.CRITICAL}),
        ),
        Pool("spare", nodes=frozenset({"n9"})),
    )


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("pools:\n  ib: {teams: [vision]}\n", "p.yaml:2: pools.ib: pool ib needs nodes: [...] or labels: [...]"),
        (
            "teams: {vision: {}}\npools:\n  ib:\n    labels: [ib]\n    teams: [nlp]\n",
            "p.yaml:5: pools.ib.teams: pool ib names team 'nlp'",
        ),
        ("pools:\n  ib: {labels: ['a b']}\n", "bad label 'a b'"),
        ("pools:\n  ib: {labels: [ib], classes: [urgent]}\n", "classes"),
    ],
)
def test_bad_pools_name_the_line(tmp_path: Path, body: str, words: str) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(body)
    with pytest.raises(PolicyFileError) as e:
        load_policy(f)
    assert words in str(e.value), str(e.value)


def test_a_job_its_pools_leave_no_node_is_refused_at_submit(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("pools:\n  reserved: {nodes: [n1], teams: [vision]}\n")
    c = make_cluster(tmp_path, policy=PolicySource(policy))
    try:
        with pytest.raises(Rejected) as e:
            c.submit(command=["true"], team="nlp")
        assert e.value.field == "team"
        assert "every node this job may use is in pool(s) reserved, closed to team nlp's normal jobs" in e.value.message
        assert c.submit(command=["true"], team="vision") > 0
        with api_client(c.service) as api:
            pools = api.get("/v1/policy").json()["pools"]
        assert pools == [
            {"name": "reserved", "nodes": ["n1"], "labels": [], "teams": ["vision"], "classes": None, "quotas": {}}
        ]
    finally:
        c.close()
