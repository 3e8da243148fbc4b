"""The rules of issue 3, one table per rule, each row a small cluster built with the builders.

Every row states what must start (and where, when it matters), which running jobs are preempted,
and why each other queued job waits (a WaitReason code, plus words its message must contain).
Rows found to disagree with the issue are strict xfails that name the bug.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpucluster.core.policy import LAS_STARVATION_AGE_S, Policy, age_policy, fifo_policy, priority_policy
from gpucluster.core.queueing import TeamQueues
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.core.types import Allocation, NodeSlice, Plan, Priority, RunningJob
from gpucluster.waits_text import sentence

from .builders import (
    H100_MB,
    job,
    no_preemption,
    node,
    org,
    policy,
    preemption,
    running,
    shared,
    snapshot,
    spread,
    team,
)
from .cycles import Cycles

R = WaitReason
NOW = 1000.0
ANY = None  # "started, placement not checked"
Where = tuple[tuple[str, tuple[int, ...]], ...] | str | None


@dataclass(frozen=True)
class Rule:
    id: str
    snap: Snapshot
    # job id -> where it must start: ((node, indices), ...) exactly, a node name, or ANY
    starts: Mapping[int, Where]
    waits: Mapping[int, WaitReason | tuple[WaitReason, str]] = field(default_factory=dict)
    preempted: frozenset[int] = frozenset()
    policy: Policy | None = None
    now: float = NOW
    estimated: Mapping[int, float | None] = field(default_factory=dict)
    xfail: str | None = None


def check(rule: Rule) -> Plan:
    plan = decide(rule.snap, rule.policy, now=rule.now)
    got = {s.job_id: s.allocation for s in plan.starts}
    assert set(got) == set(rule.starts), f"started {sorted(got)}, expected {sorted(rule.starts)}; {plan}"
    for job_id, where in rule.starts.items():
        slices = tuple((s.node, s.gpu_indices) for s in got[job_id].slices)
        if isinstance(where, str):
            assert {n for n, _ in slices} == {where}, f"job {job_id} on {slices}, expected node {where}"
        elif where is not None:
            assert slices == where, f"job {job_id} on {slices}, expected {where}"
    assert {p.job_id for p in plan.preemptions} == rule.preempted, plan.preemptions
    assert set(plan.waiting) == set(rule.waits), plan.waiting
    for job_id, want in rule.waits.items():
        reason, words = (want, "") if isinstance(want, WaitReason) else want
        wait = plan.waiting[job_id]
        assert wait.reason is reason, f"job {job_id}: {wait}"
        assert words in sentence(wait), f"job {job_id}: {wait}"
        assert sentence(wait), f"job {job_id} has no sentence"
    for job_id, at in rule.estimated.items():
        assert plan.waiting[job_id].estimated_start == at, plan.waiting[job_id]
    return plan


def params(rules: list[Rule]) -> list[object]:
    return [
        pytest.param(r, id=r.id, marks=[pytest.mark.xfail(strict=True, reason=r.xfail)] if r.xfail else [])
        for r in rules
    ]


def one_node(n: int = 8, model: str = "H100", name: str = "n1") -> list[object]:
    return [node(name).gpus(n, model)]


NO_PREEMPT = policy(preemption=no_preemption())
TWO_TEAMS = policy(team("a"), team("b"))

# ---- priority order ----------------------------------------------------------------------------

PRIORITY = [
    Rule(
        "critical, high, normal, low, whatever the submit order",
        snapshot(
            nodes=one_node(2),
            queued=[
                job(1).priority("low").at(0),
                job(2).priority("normal").at(1),
                job(3).priority("high").at(2),
                job(4).priority("critical").at(3),
            ],
        ),
        starts={4: ANY, 3: ANY},
        waits={2: R.RESERVED, 1: R.RESOURCES},
    ),
    Rule(
        "priorities off: one class, first come first served",
        snapshot(nodes=one_node(1), queued=[job(1).priority("low").at(0), job(2).priority("critical").at(1)]),
        starts={1: ANY},
        waits={2: R.RESERVED},
        policy=policy(priorities=False, preemption=no_preemption()),
    ),
    Rule(
        "priority beats fair share: a high job of the team that used the most goes first",
        snapshot(
            nodes=one_node(1),
            queued=[job(1).team("a").at(0), job(2).team("b").priority("high").at(5)],
            usage={"a": 0.0, "b": 1e9},
        ),
        starts={2: ANY},
        waits={1: R.RESERVED},
        policy=TWO_TEAMS,
    ),
]


@pytest.mark.parametrize("rule", params(PRIORITY))
def test_priority_order(rule: Rule) -> None:
    check(rule)


# ---- fair share and interleaving ---------------------------------------------------------------

FAIR_SHARE = [
    Rule(
        "the team with less decayed usage goes first, even if it submitted later",
        snapshot(
            nodes=one_node(1),
            queued=[job(1).team("a").at(0), job(2).team("b").at(50)],
            usage={"a": 7200.0, "b": 3600.0},
        ),
        starts={2: ANY},
        waits={1: R.RESERVED},
        policy=TWO_TEAMS,
    ),
    Rule(
        "usage is divided by the weight: a with weight 3 and 3x b's usage is even; age decides",
        snapshot(
            nodes=one_node(1),
            queued=[job(1).team("b").at(0), job(2).team("a").at(1)],
            usage={"a": 3000.0, "b": 1000.0},
        ),
        starts={1: ANY},
        waits={2: R.RESERVED},
        policy=policy(team("a", weight=3), team("b", weight=1)),
    ),
    Rule(
        "usage below its weighted share puts the heavier team first",
        snapshot(
            nodes=one_node(1),
            queued=[job(1).team("b").at(0), job(2).team("a").at(1)],
            usage={"a": 2999.0, "b": 1000.0},
        ),
        starts={2: ANY},
        waits={1: R.RESERVED},
        policy=policy(team("a", weight=3), team("b", weight=1)),
    ),
    Rule(
        "two-level shares: an org's weight is split among its teams",
        # research (3) = vision (2) + nlp (1); ops (1) = infra: shares 0.5, 0.25, 0.25
        snapshot(
            nodes=one_node(1),
            queued=[job(1).team("infra").at(0), job(2).team("nlp").at(1), job(3).team("vision").at(2)],
            usage={"vision": 1900.0, "nlp": 1000.0, "infra": 1000.0},
        ),
        starts={3: ANY},
        waits={1: R.RESERVED, 2: R.RESOURCES},
        policy=policy(
            team("vision", 2, org="research"),
            team("nlp", 1, org="research"),
            team("infra", 1, org="ops"),
            orgs=[org("research", 3), org("ops", 1)],
        ),
    ),
    Rule(
        "fair share off: usage is ignored, first come first served",
        snapshot(
            nodes=one_node(1),
            queued=[job(1).team("a").at(0), job(2).team("b").at(50)],
            usage={"a": 1e9, "b": 0.0},
        ),
        starts={1: ANY},
        waits={2: R.RESERVED},
        policy=policy(team("a"), team("b"), fair_share=False),
    ),
]


@pytest.mark.parametrize("rule", params(FAIR_SHARE))
def test_fair_share(rule: Rule) -> None:
    check(rule)


def test_policy_share_two_levels() -> None:
    p = policy(
        team("vision", 2, org="research"),
        team("nlp", 1, org="research"),
        team("infra", 1, org="ops"),
        team("solo", 1),
        orgs=[org("research", 3), org("ops", 1)],
    )
    # top level: research 3, ops 1, solo 1
    assert p.share("vision") == pytest.approx(3 / 5 * 2 / 3)
    assert p.share("nlp") == pytest.approx(3 / 5 * 1 / 3)
    assert p.share("infra") == pytest.approx(1 / 5)
    assert p.share("solo") == pytest.approx(1 / 5)
    assert sum(p.share(t) for t in p.teams) == pytest.approx(1.0)
    assert 0 < p.share("newcomer") < p.share("solo")  # an unknown team joins the top level
    assert policy().share("default") == pytest.approx(1.0)


def test_one_cycle_interleaves_teams() -> None:
    snap = snapshot(
        nodes=one_node(4),
        queued=[job(i).team("a").at(i) for i in range(1, 5)] + [job(i).team("b").at(i) for i in range(5, 9)],
    )
    plan = decide(snap, TWO_TEAMS, now=NOW)
    assert [s.job_id for s in plan.starts] == [1, 5, 2, 6]


def test_interleaving_follows_weights() -> None:
    snap = snapshot(
        nodes=one_node(8),
        queued=[job(i).team("a").at(i) for i in range(1, 9)] + [job(i).team("b").at(i) for i in range(11, 19)],
    )
    plan = decide(snap, policy(team("a", weight=3), team("b", weight=1)), now=NOW)
    teams = ["a" if s.job_id < 10 else "b" for s in plan.starts]
    assert teams.count("a") == 6 and teams.count("b") == 2


def test_queue_order_is_aged_then_class_then_fair_share_then_age() -> None:
    jobs = [
        job(1).team("a").at(500).build(),
        job(2).team("b").at(400).build(),
        job(3).team("a").priority("high").at(900).build(),
        job(4).team("b").priority("low").at(0).build(),  # aged: waited the starvation age
        job(5).team("b").at(450).build(),
    ]
    queues = TeamQueues(jobs, policy(team("a"), team("b"), starvation_age_s=1000), {"a": 10.0, "b": 20.0}, now=1000)
    order = []
    while (j := queues.pop()) is not None:
        order.append(j.job_id)
        queues.done(j, started=False)
    assert order == [4, 3, 1, 2, 5]


# ---- quotas ------------------------------------------------------------------------------------

QUOTA = [
    Rule(
        "a team may borrow idle GPUs beyond its quota when no limit is set",
        snapshot(nodes=one_node(8), queued=[job(1).gpus(6).team("a")]),
        starts={1: ANY},
        policy=policy(team("a", quota={"H100": 2}), team("b", quota={"H100": 6})),
    ),
    Rule(
        "max_borrow caps what a team uses beyond its quota, even with idle GPUs",
        snapshot(
            nodes=one_node(8),
            queued=[job(1).gpus(2).team("a"), job(2).team("a"), job(3).team("a")],
        ),
        starts={1: ANY, 2: ANY},
        waits={3: (R.QUOTA, "its borrowing limit is 1")},
        policy=policy(team("a", quota={"H100": 2}, max_borrow=1), team("b")),
    ),
    Rule(
        "max_borrow counts borrowing on every model",
        snapshot(
            nodes=[node("h").gpus(4, "H100"), node("x").gpus(4, "A100")],
            running=[running(100, "x", 0, 1, team="a")],
            queued=[job(1).gpu_type("H100").team("a")],
        ),
        starts={},
        waits={1: (R.QUOTA, "would borrow 3 GPUs")},
        policy=policy(team("a", quota={"H100": 0, "A100": 0}, max_borrow=2)),
    ),
    Rule(
        "max_lend: idle guaranteed GPUs beyond what the owner lends stay free",
        # a: quota 4, lends at most 1: 3 of the 8 idle GPUs are kept for a
        snapshot(nodes=one_node(8), queued=[job(1).gpus(6).team("b")]),
        starts={},
        waits={1: (R.QUOTA, "do not lend")},
        policy=policy(team("a", quota={"H100": 4}, max_lend=1), team("b")),
    ),
    Rule(
        "max_lend: a borrower may take the lent part",
        snapshot(nodes=one_node(8), queued=[job(1).gpus(5).team("b"), job(2).team("b")]),
        starts={1: ANY},
        waits={2: (R.QUOTA, "do not lend")},
        policy=policy(team("a", quota={"H100": 4}, max_lend=1), team("b")),
    ),
    Rule(
        "max_lend does not hold GPUs back from their owner",
        snapshot(nodes=one_node(8), queued=[job(1).gpus(4).team("a"), job(2).gpus(4).team("b")]),
        starts={1: ANY, 2: ANY},
        policy=policy(team("a", quota={"H100": 4}, max_lend=0), team("b")),
    ),
]


@pytest.mark.parametrize("rule", params(QUOTA))
def test_quota(rule: Rule) -> None:
    check(rule)


# ---- preemption --------------------------------------------------------------------------------

PREEMPTION = [
    Rule(
        "a higher class preempts a lower one",
        snapshot(
            nodes=one_node(1), running=[running(100, "n1", 0, priority="normal")], queued=[job(1).priority("high")]
        ),
        starts={},
        waits={1: (R.PREEMPTING, "preempting job(s) 100")},
        preempted=frozenset({100}),
    ),
    Rule(
        "the same class never preempts",
        snapshot(nodes=one_node(1), running=[running(100, "n1", 0, priority="high")], queued=[job(1).priority("high")]),
        starts={},
        waits={1: R.RESERVED},
    ),
    Rule(
        "preemption off: nothing is preempted",
        snapshot(nodes=one_node(1), running=[running(100, "n1", 0, priority="low")], queued=[job(1).priority("high")]),
        starts={},
        waits={1: R.RESERVED},
        policy=NO_PREEMPT,
    ),
    Rule(
        "a team below its quota reclaims its GPUs from a borrower of the same class",
        snapshot(
            nodes=one_node(4),
            running=[running(100, "n1", 0, 1, team="b"), running(101, "n1", 2, 3, team="b", started_at=5)],
            queued=[job(1).gpus(2).team("a")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "preempting job(s) 101")},  # the one with least work lost
        preempted=frozenset({101}),
        policy=policy(team("a", quota={"H100": 4}), team("b")),
    ),
    Rule(
        "quota reclaim works even against a higher class",
        snapshot(
            nodes=one_node(2),
            running=[running(100, "n1", 0, 1, team="b", priority="high")],
            queued=[job(1).gpus(2).team("a").priority("low")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "preempting job(s) 100")},
        preempted=frozenset({100}),
        policy=policy(team("a", quota={"H100": 2}), team("b")),
    ),
    Rule(
        "no reclaim from a team within its own quota",
        snapshot(
            nodes=one_node(4),
            running=[running(100, "n1", 0, 1, team="b"), running(101, "n1", 2, 3, team="a")],
            queued=[job(1).team("a")],
        ),
        starts={},
        waits={1: R.RESERVED},
        policy=policy(team("a", quota={"H100": 2}), team("b", quota={"H100": 2})),
    ),
    Rule(
        "no reclaim for demand beyond the team's quota",
        snapshot(
            nodes=one_node(4),
            running=[running(100, "n1", 0, 1, 2, 3, team="b")],
            queued=[job(1).gpus(3).team("a")],
        ),
        starts={},
        waits={1: R.RESERVED},
        policy=policy(team("a", quota={"H100": 2}), team("b")),
    ),
    Rule(
        "reclaim off: a team below quota waits",
        snapshot(nodes=one_node(2), running=[running(100, "n1", 0, 1, team="b")], queued=[job(1).team("a")]),
        starts={},
        waits={1: R.RESERVED},
        policy=policy(team("a", quota={"H100": 2}), team("b"), preemption=preemption(reclaim_quota=False)),
    ),
    Rule(
        "min runtime: a job that started recently is not preempted yet",
        snapshot(
            nodes=one_node(1),
            running=[running(100, "n1", 0, priority="low", started_at=NOW - 59)],
            queued=[job(1).priority("high")],
        ),
        starts={},
        waits={1: R.RESERVED},
        policy=policy(preemption=preemption(min_runtime_s=60)),
    ),
    Rule(
        "min runtime: once it has run that long it is",
        snapshot(
            nodes=one_node(1),
            running=[running(100, "n1", 0, priority="low", started_at=NOW - 60)],
            queued=[job(1).priority("high")],
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({100}),
        policy=policy(preemption=preemption(min_runtime_s=60)),
    ),
    Rule(
        "the protected (critical) class is never preempted by priority",
        snapshot(
            nodes=one_node(1),
            running=[running(100, "n1", 0, priority="critical")],
            queued=[job(1).priority("critical")],
        ),
        starts={},
        waits={1: R.RESERVED},
    ),
    Rule(
        "the protected (critical) class is never preempted by quota reclaim",
        snapshot(
            nodes=one_node(2),
            running=[running(100, "n1", 0, 1, team="b", priority="critical")],
            queued=[job(1).team("a").priority("critical")],
        ),
        starts={},
        waits={1: R.RESERVED},
        policy=policy(team("a", quota={"H100": 2}), team("b")),
    ),
    Rule(
        "protected classes are configurable",
        snapshot(
            nodes=one_node(2),
            running=[running(100, "n1", 0, priority="normal"), running(101, "n1", 1, priority="low")],
            queued=[job(1).priority("critical")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "job(s) 100")},
        preempted=frozenset({100}),
        policy=policy(preemption=preemption(protected_classes=["low", "critical"])),
    ),
    Rule(
        "a service replica (serving) preempts only checkpointed work by default",
        snapshot(
            nodes=one_node(2),
            running=[
                running(100, "n1", 0, priority="normal", started_at=100),  # never checkpointed
                running(101, "n1", 1, priority="high", started_at=100, checkpoint=900),
            ],
            queued=[job(1).priority("serving")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "job(s) 101")},
        preempted=frozenset({101}),
    ),
    Rule(
        "a service replica waits when nothing running has checkpointed",
        snapshot(
            nodes=one_node(1),
            running=[running(100, "n1", 0, priority="low", started_at=100)],
            queued=[job(1).priority("serving")],
        ),
        starts={},
        waits={1: R.RESERVED},
    ),
    Rule(
        "serving_victims: any lets a replica preempt work that never checkpointed",
        snapshot(
            nodes=one_node(1),
            running=[running(100, "n1", 0, priority="low", started_at=100)],
            queued=[job(1).priority("serving")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "job(s) 100")},
        preempted=frozenset({100}),
        policy=policy(preemption=preemption(serving_victims="any")),
    ),
    Rule(
        "serving_victims: none keeps replicas from preempting at all",
        snapshot(
            nodes=one_node(1),
            running=[running(100, "n1", 0, priority="low", started_at=100, checkpoint=900)],
            queued=[job(1).priority("serving")],
        ),
        starts={},
        waits={1: R.RESERVED},
        policy=policy(preemption=preemption(serving_victims="none")),
    ),
    Rule(
        "a high job still preempts work that never checkpointed (the rule is the serving class's)",
        snapshot(
            nodes=one_node(1),
            running=[running(100, "n1", 0, priority="low", started_at=100)],
            queued=[job(1).priority("high")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "job(s) 100")},
        preempted=frozenset({100}),
    ),
    Rule(
        "victims: the lowest class first",
        snapshot(
            nodes=one_node(2),
            running=[running(100, "n1", 0, priority="normal"), running(101, "n1", 1, priority="low", started_at=900)],
            queued=[job(1).priority("high")],
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({101}),
    ),
    Rule(
        "victims: then the team most over its fair share",
        snapshot(
            nodes=one_node(2),
            running=[running(100, "n1", 0, team="x", priority="low"), running(101, "n1", 1, team="y", priority="low")],
            queued=[job(1).priority("high")],
            usage={"x": 1000.0, "y": 100.0},
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({100}),
        policy=policy(team("x"), team("y")),
    ),
    Rule(
        "victims: over fair share is usage per share (weights count)",
        snapshot(
            nodes=one_node(2),
            running=[running(100, "n1", 0, team="x", priority="low"), running(101, "n1", 1, team="y", priority="low")],
            queued=[job(1).priority("high")],
            usage={"x": 1000.0, "y": 400.0},
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({101}),  # x: 1000 / 0.9 < y: 400 / 0.1
        policy=policy(team("x", weight=9), team("y", weight=1)),
    ),
    Rule(
        "victims: then the least work since the last checkpoint",
        snapshot(
            nodes=one_node(2),
            running=[
                running(100, "n1", 0, priority="low", started_at=0, checkpoint=NOW - 10),
                running(101, "n1", 1, priority="low", started_at=500, checkpoint=None),
            ],
            queued=[job(1).priority("high")],
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({100}),  # 10 s lost, against 500 s for the job without a checkpoint
    ),
    Rule(
        "victims: never more than needed (a cheaper victim that turns out unneeded is spared)",
        snapshot(
            nodes=one_node(4),
            running=[running(100, "n1", 0, priority="low"), running(101, "n1", 1, 2, 3, priority="normal")],
            queued=[job(1).gpus(3).priority("high")],
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({101}),
    ),
    Rule(
        "victims: free GPUs count, so only the missing ones are freed",
        snapshot(
            nodes=one_node(4),
            running=[running(100, "n1", 0, priority="low"), running(101, "n1", 1, priority="low", started_at=1)],
            queued=[job(1).gpus(3).priority("high")],
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({101}),
    ),
    Rule(
        "victims: the node needing the fewest victims",
        snapshot(
            nodes=[node("a").gpus(2), node("b").gpus(2)],
            running=[
                running(100, "a", 0, priority="low"),
                running(101, "a", 1, priority="low"),
                running(102, "b", 0, 1, priority="low", started_at=10),
            ],
            queued=[job(1).gpus(2).priority("high")],
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({102}),
    ),
    Rule(
        "victims for a job larger than a node come from several nodes",
        snapshot(
            nodes=[node("a").gpus(4), node("b").gpus(4)],
            running=[
                running(100, "a", 0, 1, 2, 3, priority="low"),
                running(101, "b", 0, 1, priority="low"),
                running(102, "b", 2, 3, priority="normal"),
            ],
            queued=[job(1).gpus(6).priority("high")],
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({100, 101}),
    ),
    Rule(
        "stopping jobs count as free: no extra victims while they exit",
        snapshot(
            nodes=one_node(2),
            running=[running(100, "n1", 0, priority="low", stopping=True), running(101, "n1", 1, priority="low")],
            queued=[job(1).priority("high")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "waiting for stopping jobs")},
    ),
    Rule(
        "stopping jobs count, and only the rest is preempted",
        snapshot(
            nodes=one_node(3),
            running=[
                running(100, "n1", 0, priority="low", stopping=True),
                running(101, "n1", 1, priority="low"),
                running(102, "n1", 2, priority="low", started_at=5),
            ],
            queued=[job(1).gpus(2).priority("high")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "job(s) 102")},
        preempted=frozenset({102}),
    ),
    Rule(
        "one preemptor per GPU model per cycle: a victim serves one job, the next high job waits its turn",
        snapshot(
            nodes=one_node(2),
            running=[running(100, "n1", 0, priority="low"), running(101, "n1", 1, priority="low", started_at=5)],
            queued=[job(1).priority("high").at(0), job(2).priority("high").at(1)],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "job(s) 101"), 2: R.RESOURCES},
        preempted=frozenset({101}),
    ),
    Rule(
        "one preemptor per GPU model per cycle: the second whole-node job does not claim the first's victims",
        snapshot(
            nodes=[node("n1").gpus(8), node("n2").gpus(8)],
            running=[running(100, "n1", *range(8), priority="low"), running(101, "n2", *range(8), priority="low")],
            queued=[job(1).gpus(8).priority("high").at(0), job(2).gpus(8).priority("high").at(1)],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "job(s) 100"), 2: R.RESOURCES},
        preempted=frozenset({100}),
    ),
    Rule(
        "another GPU model has its own preemptor in the same cycle",
        snapshot(
            nodes=[node("h").gpus(1, "H100"), node("a").gpus(1, "A100", 40960)],
            running=[running(100, "h", 0, priority="low"), running(101, "a", 0, priority="low")],
            queued=[job(1).gpu_type("H100").priority("high"), job(2).gpu_type("A100").priority("high")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "job(s) 100"), 2: (R.PREEMPTING, "job(s) 101")},
        preempted=frozenset({100, 101}),
    ),
    Rule(
        "a job its team's borrowing limit refuses does not preempt (the victims would be stopped for nothing)",
        snapshot(
            nodes=one_node(3),
            running=[running(100, "n1", 0, team="b", priority="low")],
            queued=[job(1).gpus(3).team("a")],
        ),
        starts={},
        waits={1: (R.QUOTA, "its borrowing limit is 2")},
        policy=policy(team("a", max_borrow=2), team("b")),
    ),
    Rule(
        "a whole-GPU job preempts fractional jobs: a shared GPU is free once every share on it goes",
        snapshot(
            nodes=one_node(2),
            running=[
                shared(100, "n1", 0, 0.5, priority="low", started_at=900),
                shared(101, "n1", 0, 0.5, priority="critical"),  # protected: GPU 0 never comes free
                shared(102, "n1", 1, 0.5, priority="low"),
                shared(103, "n1", 1, 0.25, priority="low", started_at=500),
            ],
            queued=[job(1).priority("high")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "preempting job(s) 103, 102")},
        preempted=frozenset({102, 103}),
    ),
    Rule(
        "a fractional job preempts only the share it needs, the cheapest that frees it",
        snapshot(
            nodes=one_node(1),
            running=[
                shared(100, "n1", 0, 0.5, priority="low"),
                shared(101, "n1", 0, 0.25, priority="low", started_at=100),
                shared(102, "n1", 0, 0.25, priority="low", started_at=900),
            ],
            queued=[job(1).gpus(0.25).priority("high")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "preempting job(s) 102 to free 0.25 H100 GPUs")},
        preempted=frozenset({102}),
    ),
    Rule(
        "a fractional job by memory preempts until its memory is free too",
        snapshot(
            nodes=one_node(1),
            running=[shared(100 + i, "n1", 0, 0.25, priority="low", started_at=100 * i) for i in range(4)],
            queued=[job(1).gpus(1).memory(50_000).priority("high")],  # 61% of an 80 GiB GPU
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({101, 102, 103}),
    ),
    Rule(
        "a fractional job preempts a whole-GPU job when no share is left",
        snapshot(
            nodes=one_node(1),
            running=[running(100, "n1", 0, priority="low")],
            queued=[job(1).gpus(0.5).priority("high")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "preempting job(s) 100")},
        preempted=frozenset({100}),
    ),
    Rule(
        "a fractional job is not preempted for by a job of its own class",
        snapshot(
            nodes=one_node(1), running=[shared(100, "n1", 0, 0.5, priority="high")], queued=[job(1).priority("high")]
        ),
        starts={},
        waits={1: R.RESERVED},
    ),
    Rule(
        "a gang over exactly M nodes preempts the cheapest victims on M nodes",
        snapshot(
            nodes=[node("n1").gpus(4), node("n2").gpus(4), node("n3").gpus(4)],
            running=[
                running(100, "n1", 0, 1, priority="low", started_at=900),
                running(101, "n1", 2, 3, priority="low"),
                running(102, "n2", 0, 1, priority="low", started_at=800),
                running(103, "n2", 2, 3, priority="low"),
                running(104, "n3", 0, 1, 2, 3, priority="low"),  # 1000 s of work lost: the dearest
            ],
            queued=[job(1).gpus(4).nodes(2).priority("high")],
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({100, 102}),
    ),
    Rule(
        "a gang over M nodes counts the nodes that are free already",
        snapshot(
            nodes=[node("n1").gpus(2), node("n2").gpus(2)],
            running=[running(100, "n1", 0, 1, priority="low")],
            queued=[job(1).gpus(4).nodes(2).priority("high")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "preempting job(s) 100")},
        preempted=frozenset({100}),
    ),
    Rule(
        "a gang over M nodes: one victim spanning two nodes makes a cheaper one elsewhere unneeded",
        snapshot(  # found by test_every_shape_preempts_what_it_needs_and_no_more
            nodes=[node("n1").gpus(2), node("n2").gpus(2), node("n3").gpus(2)],
            running=[
                running(100, "n1", 0, priority="low", started_at=900),  # the cheapest victim
                running(101, "n1", 1, priority="critical"),  # never a victim
                spread(102, {"n2": [0, 1], "n3": [0, 1]}, priority="low"),  # frees 2 nodes alone
            ],
            queued=[job(1).gpus(2).nodes(2).priority("high")],
        ),
        starts={},
        waits={1: (R.PREEMPTING, "preempting job(s) 102")},
        preempted=frozenset({102}),
    ),
    Rule(
        "a job larger than a node: the victims that let it span the fewest nodes, at equal count",
        snapshot(
            nodes=[node("n1").gpus(4), node("n2").gpus(4), node("n3").gpus(4)],
            running=[  # the cheapest three (100, 102, 104) are one per node: it would span 3 nodes
                running(100, "n1", 0, 1, priority="low", started_at=900),
                running(101, "n1", 2, 3, priority="low", started_at=600),
                running(102, "n2", 0, 1, priority="low", started_at=890),
                running(103, "n2", 2, 3, priority="low"),
                running(104, "n3", 0, 1, priority="low", started_at=880),
                running(105, "n3", 2, 3, priority="low"),
            ],
            queued=[job(1).gpus(6).priority("high")],
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({100, 101, 102}),  # n1 emptied, 2 GPUs on n2: 4 + 2
    ),
]


@pytest.mark.parametrize("rule", params(PREEMPTION))
def test_preemption(rule: Rule) -> None:
    plan = check(rule)
    for p in plan.preemptions:
        assert p.for_job in {j.job_id for j in rule.snap.queued}
        assert p.reason.startswith("preempted")


def test_queued_preemptors_each_get_their_victims_in_turn() -> None:
    """Closed loop: two high whole-node jobs on two nodes of low jobs; each low job is preempted once."""
    lows = [
        job(1).gpus(8).priority("low").at(0).limit(20_000).build(),
        job(2).gpus(8).priority("low").at(0).limit(20_000).build(),
    ]
    highs = [
        job(3).gpus(8).priority("high").at(100).limit(600).build(),
        job(4).gpus(8).priority("high").at(100).limit(600).build(),
    ]
    sim = Cycles((node("n1").gpus(8).build(), node("n2").gpus(8).build()), Policy(), [*lows, *highs])
    assert sim.run(50, until=[3, 4], max_step=60)
    assert sorted((victim, for_job) for _, victim, for_job in sim.preemptions) in ([(1, 3), (2, 4)], [(1, 4), (2, 3)])
    assert sim.starts == {1: 2, 2: 2, 3: 1, 4: 1}  # the low jobs ran again after the high ones (attempt 2)
    assert max(sim.first_start[3], sim.first_start[4]) <= 100 + 2 * (5 + 60)


def test_preemption_reasons_name_the_cause() -> None:
    by_class = decide(
        snapshot(nodes=one_node(1), running=[running(100, "n1", 0, priority="low")], queued=[job(7).priority("high")]),
        now=NOW,
    )
    assert [(p.job_id, p.for_job, p.reason) for p in by_class.preemptions] == [
        (100, 7, "preempted by job 7 (high priority)")
    ]
    by_quota = decide(
        snapshot(nodes=one_node(1), running=[running(100, "n1", 0, team="b")], queued=[job(7).team("a")]),
        policy(team("a", quota={"H100": 1}), team("b")),
        now=NOW,
    )
    assert [p.reason for p in by_quota.preemptions] == ["preempted: team a reclaims its guaranteed H100 GPUs"]


def test_preempting_sets_a_reservation_so_backfill_cannot_steal_the_freed_gpus() -> None:
    snap = snapshot(
        nodes=one_node(2),
        running=[running(100, "n1", 0, priority="low", limit=10_000)],
        queued=[job(1).gpus(2).priority("high").at(0), job(2).limit(7200).at(1)],
    )
    plan = decide(snap, now=NOW)
    assert {p.job_id for p in plan.preemptions} == {100}  # job 2 finds no victim of its own
    assert plan.starts == ()  # the one free GPU is held for job 1, which starts once 100 exits
    assert plan.waiting[1].reason is R.PREEMPTING
    assert plan.waiting[2].reason is R.BEHIND_RESERVATION  # it would take the GPU held for job 1


def test_a_preempting_wait_is_never_claimed_without_a_stopping_job() -> None:
    """A job blocked only by a reservation must not say it waits for stopping jobs when none exist."""
    snap = snapshot(
        nodes=[node("n1").gpus(8), node("n3").gpus(4)],
        running=[running(100, "n1", 0, 1, 2, 3), running(101, "n3", 0, 1, 2, 3, priority="low")],
        queued=[job(1).gpus(8).at(0), job(2).limit(7200).at(1)],
    )
    plan = decide(snap, now=NOW)
    assert plan.waiting[1].reason is R.RESERVED
    assert plan.waiting[2].reason is R.BEHIND_RESERVATION, plan.waiting[2]
    assert plan.preemptions == ()


# ---- gang, GPU type, topology, packing ---------------------------------------------------------

PLACEMENT = [
    Rule(
        "gang: a job gets all its GPUs or none (no partial start)",
        snapshot(nodes=one_node(8), running=[running(100, "n1", 0, 1, 2, priority="high")], queued=[job(1).gpus(6)]),
        starts={},
        waits={1: R.RESERVED},
    ),
    Rule(
        "gang: a multi-node job starts on all its nodes at once or waits",
        snapshot(
            nodes=[node("a").gpus(4), node("b").gpus(4)],
            running=[running(100, "b", 0, priority="high")],
            queued=[job(1).gpus(8)],
        ),
        starts={},
        waits={1: R.RESERVED},
    ),
    Rule(
        "GPU type required: only that model",
        snapshot(nodes=[node("a").gpus(4, "A100"), node("h").gpus(4, "H100")], queued=[job(1).gpu_type("H100")]),
        starts={1: (("h", (0,)),)},
    ),
    Rule(
        "preference list: the first model with room",
        snapshot(
            nodes=[node("a").gpus(4, "A100"), node("h").gpus(4, "H100"), node("l").gpus(4, "L4")],
            running=[running(100, "h", 0, 1, 2, priority="high")],
            queued=[job(1).gpus(2).gpu_types("H100", "A100", "L4"), job(2).gpus(2).gpu_types("L4", "A100")],
        ),
        starts={1: "a", 2: "l"},
    ),
    Rule(
        "preference list: the first model when it has room, whatever the order of nodes",
        snapshot(
            nodes=[node("a").gpus(4, "A100"), node("l").gpus(4, "L4")],
            queued=[job(1).gpu_types("L4", "A100"), job(2).gpu_types("A100", "L4")],
        ),
        starts={1: "l", 2: "a"},
    ),
    Rule(
        "minimum GPU memory filters models",
        snapshot(
            nodes=[node("small").gpus(4, "A100-40GB", 40960), node("big").gpus(4, "A100-80GB", 81920)],
            queued=[job(1).min_memory(50000), job(2).min_memory(40960)],
        ),
        starts={1: "big", 2: "small"},  # untyped: the smallest GPU that qualifies
    ),
    Rule(
        "minimum GPU memory no model has: no fit",
        snapshot(nodes=[node("a").gpus(4, "A100", 40960)], queued=[job(1).min_memory(50000)]),
        starts={},
        waits={1: R.NO_FIT},
    ),
    Rule(
        "untyped jobs take the smallest GPUs first, keeping big ones free",
        snapshot(
            nodes=[node("h").gpus(2, "H100", 81920), node("l").gpus(2, "L4", 24576)],
            queued=[job(1).gpus(2), job(2).gpus(2)],
        ),
        starts={1: "l", 2: "h"},
    ),
    Rule(
        "topology: one node when it fits, not spread over emptier ones",
        snapshot(
            nodes=[node("a").gpus(8), node("b").gpus(8), node("c").gpus(8)],
            running=[running(100, "a", 0, 1, 2, 3, priority="high")],
            queued=[job(1).gpus(4)],
        ),
        starts={1: (("a", (4, 5, 6, 7)),)},
    ),
    Rule(
        "topology: larger than a node, the fewest nodes",
        snapshot(
            nodes=[node("a").gpus(8), node("b").gpus(8), node("c").gpus(8)],
            running=[running(100, "c", 0, 1, 2, 3, priority="high")],
            queued=[job(1).gpus(12)],
        ),
        starts={1: (("a", tuple(range(8))), ("c", (4, 5, 6, 7)))},
    ),
    Rule(
        "topology: fewest nodes even when every node is partly busy",
        snapshot(
            nodes=[node("a").gpus(8), node("b").gpus(8), node("c").gpus(8), node("d").gpus(8)],
            running=[
                running(100, "a", 0, 1, priority="high"),
                running(101, "b", 0, 1, 2, 3, 4, priority="high"),
                running(102, "c", 0, 1, 2, 3, 4, priority="high"),
                running(103, "d", 0, 1, priority="high"),
            ],
            queued=[job(1).gpus(12)],
        ),
        starts={1: (("a", (2, 3, 4, 5, 6, 7)), ("d", (2, 3, 4, 5, 6, 7)))},
    ),
    Rule(
        "nodes=N: exactly N nodes, GPUs split evenly",
        snapshot(
            nodes=[node("a").gpus(8), node("b").gpus(8), node("c").gpus(8)],
            running=[running(100, "a", 0, 1, 2, 3, 4, 5, priority="high")],
            queued=[job(1).gpus(8).nodes(2)],
        ),
        starts={1: (("b", (0, 1, 2, 3)), ("c", (0, 1, 2, 3)))},
    ),
    Rule(
        "nodes=N that no N nodes can host: no fit",
        snapshot(nodes=[node("a").gpus(8), node("b").gpus(4)], queued=[job(1).gpus(16).nodes(2)]),
        starts={},
        waits={1: R.NO_FIT},
    ),
    Rule(
        "domains: GPUs in one NVLink domain, best fit among domains",
        snapshot(
            nodes=[node("n1").gpus(4, domain="nvl0").gpus(4, domain="nvl1")],
            running=[running(100, "n1", 0, priority="high")],
            queued=[job(1).gpus(3), job(2).gpus(2)],
        ),
        starts={1: (("n1", (1, 2, 3)),), 2: (("n1", (4, 5)),)},
    ),
    Rule(
        "domains: a job that fits one domain never straddles two",
        snapshot(
            nodes=[node("n1").gpus(4, domain="nvl0").gpus(4, domain="nvl1")],
            running=[running(100, "n1", 0, priority="high")],
            queued=[job(1).gpus(4)],
        ),
        starts={1: (("n1", (4, 5, 6, 7)),)},
    ),
    Rule(
        "domains: larger than any free domain, the fewest domains",
        snapshot(
            nodes=[node("n1").gpus(2, domain="p0").gpus(2, domain="p1").gpus(4, domain="p2")],
            running=[running(100, "n1", 0, priority="high")],
            queued=[job(1).gpus(6)],
        ),
        starts={1: (("n1", (2, 3, 4, 5, 6, 7)),)},
    ),
    Rule(
        "packing: small jobs fill one node, the whole other node stays free for a large one",
        snapshot(
            nodes=[node("a").gpus(8), node("b").gpus(8)],
            queued=[job(1).gpus(2), job(2).gpus(3), job(3).gpus(1), job(4).gpus(8)],
        ),
        starts={1: "a", 2: "a", 3: "a", 4: "b"},
    ),
]


@pytest.mark.parametrize("rule", params(PLACEMENT))
def test_placement(rule: Rule) -> None:
    check(rule)


# ---- fractional GPUs ---------------------------------------------------------------------------

FRACTIONS = [
    Rule(
        "four quarter-GPU jobs share one GPU; the fifth opens the next",
        snapshot(nodes=one_node(2), queued=[job(i).gpus(0.25) for i in range(1, 6)]),
        starts={1: (("n1", (0,)),), 2: (("n1", (0,)),), 3: (("n1", (0,)),), 4: (("n1", (0,)),), 5: (("n1", (1,)),)},
    ),
    Rule(
        "never more than 100% of a GPU",
        snapshot(nodes=one_node(1), running=[shared(100, "n1", 0, 0.5)], queued=[job(1).gpus(0.5), job(2).gpus(0.1)]),
        starts={1: ANY},
        waits={2: R.RESOURCES},
    ),
    Rule(
        "never more than 100% of a GPU's memory, whatever the share",
        snapshot(
            nodes=one_node(1),
            running=[shared(100, "n1", 0, 0.25, memory_mb=70000)],
            queued=[job(1).memory(12000), job(2).memory(11000)],
        ),
        starts={2: ANY},
        waits={1: R.RESOURCES},
    ),
    Rule(
        "a fractional job prefers a GPU already shared, best fit",
        snapshot(
            nodes=one_node(4),
            running=[shared(100, "n1", 1, 0.5), shared(101, "n1", 2, 0.75)],
            queued=[job(1).gpus(0.25), job(2).gpus(0.5)],
        ),
        starts={1: (("n1", (2,)),), 2: (("n1", (1,)),)},
    ),
    Rule(
        "a whole-GPU job never takes a shared GPU",
        snapshot(nodes=one_node(2), running=[shared(100, "n1", 0, 0.25)], queued=[job(1).gpus(2)]),
        starts={},
        waits={1: R.RESERVED},  # held for it from when the fractional job ends
        estimated={1: 3600.0},
    ),
    Rule(
        "a fractional job never shares a GPU held whole",
        snapshot(nodes=one_node(2), running=[running(100, "n1", 0)], queued=[job(1).gpus(0.5)]),
        starts={1: (("n1", (1,)),)},
    ),
    Rule(
        "a memory share needs a model with that much memory",
        snapshot(
            nodes=[node("l").gpus(1, "L4", 24576), node("h").gpus(1, "H100", 81920)],
            queued=[job(1).memory(30000)],
        ),
        starts={1: "h"},
    ),
]


@pytest.mark.parametrize("rule", params(FRACTIONS))
def test_fractions(rule: Rule) -> None:
    check(rule)


def test_fractional_shares_and_memory_are_stated_in_the_slice() -> None:
    plan = decide(snapshot(nodes=one_node(1), queued=[job(1).gpus(0.25), job(2).memory(20480)]), now=NOW)
    by_id = {s.job_id: s.allocation.slices[0] for s in plan.starts}
    assert (by_id[1].share, by_id[1].memory_mb) == (0.25, H100_MB // 4)
    assert (by_id[2].share, by_id[2].memory_mb) == (0.25, 20480)
    assert sum(s.allocation.gpu_count for s in plan.starts) == 0.5


# ---- EASY backfill and reasons -----------------------------------------------------------------

# Job 100 ends at t=2000 (started 0, limit 2000) on node a; job 1 needs all of a: its shadow time is
# 2000. Node b has one GPU free for jobs that keep off a.
BACKFILL_NODES = [node("a").gpus(8), node("b").gpus(8)]
BACKFILL_RUNNING = [
    running(100, "a", 0, 1, 2, 3, started_at=0, limit=2000, priority="high"),
    running(101, "b", 0, 1, 2, 3, 4, 5, 6, started_at=0, limit=1e6, priority="high"),
]

BACKFILL = [
    Rule(
        "the first job in line gets a reservation and its estimated start",
        snapshot(nodes=BACKFILL_NODES, running=BACKFILL_RUNNING, queued=[job(1).gpus(8)]),
        starts={},
        waits={1: (R.RESERVED, "first in line: 8 H100 GPUs on a")},
        estimated={1: 2000.0},
    ),
    Rule(
        "a short job that ends before the shadow time starts on the reserved node",
        snapshot(nodes=BACKFILL_NODES, running=BACKFILL_RUNNING, queued=[job(1).gpus(8), job(2).gpus(2).limit(1000)]),
        starts={2: "a"},
        waits={1: R.RESERVED},
        estimated={1: 2000.0},
    ),
    Rule(
        "a long job that keeps off the reserved node starts",
        snapshot(nodes=BACKFILL_NODES, running=BACKFILL_RUNNING, queued=[job(1).gpus(8), job(2).limit(5000)]),
        starts={2: (("b", (7,)),)},
        waits={1: R.RESERVED},
    ),
    Rule(
        "a long job that needs the reserved node waits behind the reservation",
        snapshot(nodes=BACKFILL_NODES, running=BACKFILL_RUNNING, queued=[job(1).gpus(8), job(2).gpus(2).limit(1001)]),
        starts={},
        waits={1: R.RESERVED, 2: (R.BEHIND_RESERVATION, "would delay job 1")},
    ),
    Rule(
        "the same request with a shorter limit still backfills right after one that waits",
        snapshot(
            nodes=BACKFILL_NODES,
            running=BACKFILL_RUNNING,
            queued=[job(1).gpus(8), job(2).gpus(2).limit(1001), job(3).gpus(2).limit(1000)],
        ),
        starts={3: "a"},
        waits={1: R.RESERVED, 2: R.BEHIND_RESERVATION},
    ),
    Rule(
        "a job without a limit counts with the policy's default time limit",
        snapshot(nodes=BACKFILL_NODES, running=BACKFILL_RUNNING, queued=[job(1).gpus(8), job(2).gpus(2)]),
        starts={2: "a"},
        waits={1: R.RESERVED},
        policy=policy(default_time_limit_s=900),
    ),
    Rule(
        "the reservation's estimate uses the policy default for running jobs without a limit",
        snapshot(
            nodes=one_node(2),
            running=[running(100, "n1", 0, started_at=400, priority="high")],
            queued=[job(1).gpus(2)],
        ),
        starts={},
        waits={1: R.RESERVED},
        estimated={1: 400.0 + 600},
        policy=policy(default_time_limit_s=600),
    ),
    Rule(
        "a multi-node reservation waits for enough GPUs over the model's nodes",
        snapshot(
            nodes=[node("a").gpus(4), node("b").gpus(4)],
            running=[
                running(100, "a", 0, 1, started_at=0, limit=1500, priority="high"),
                running(101, "b", 0, 1, started_at=0, limit=3000, priority="high"),
            ],
            queued=[job(1).gpus(6), job(2).limit(100), job(3).limit(10_000)],
        ),
        starts={2: ANY},
        waits={1: R.RESERVED, 3: R.BEHIND_RESERVATION},
        estimated={1: 1500.0},
    ),
    Rule(
        "only the first blocked job of a model holds a reservation; the next waits for resources",
        snapshot(nodes=BACKFILL_NODES, running=BACKFILL_RUNNING, queued=[job(1).gpus(8), job(2).gpus(8)]),
        starts={},
        waits={1: R.RESERVED, 2: (R.RESOURCES, "needs 8 free H100")},
        estimated={1: 2000.0, 2: None},
    ),
    Rule(
        "backfill off: a job that would delay the first in line waits even off the reserved node",
        snapshot(nodes=BACKFILL_NODES, running=BACKFILL_RUNNING, queued=[job(1).gpus(8), job(2).limit(5000)]),
        starts={},
        waits={1: R.RESERVED, 2: R.BEHIND_RESERVATION},
        policy=policy(backfill=False),
    ),
    Rule(
        "backfill off: not even a short job starts ahead of the first in line",
        snapshot(nodes=BACKFILL_NODES, running=BACKFILL_RUNNING, queued=[job(1).gpus(8), job(2).gpus(2).limit(100)]),
        starts={},
        waits={1: R.RESERVED, 2: R.BEHIND_RESERVATION},
        policy=policy(backfill=False),
    ),
    Rule(
        "jobs started earlier in the same cycle count with their own time limit in the reservation",
        # job 1 (limit 60 s) takes half of n1; job 2 needs all of n1: it can start at now + 60, so job 3
        # (30 min) would delay it and must not backfill onto n1
        snapshot(
            nodes=one_node(8),
            queued=[job(1).gpus(4).limit(60).at(0), job(2).gpus(8).at(1), job(3).gpus(4).limit(1800).at(2)],
        ),
        starts={1: ANY},
        waits={2: R.RESERVED, 3: R.BEHIND_RESERVATION},
        estimated={2: NOW + 60},
    ),
    Rule(
        "another GPU model is not held back by a reservation",
        snapshot(
            nodes=[*BACKFILL_NODES, node("x").gpus(2, "A100")],
            running=BACKFILL_RUNNING,
            queued=[job(1).gpus(8).gpu_type("H100"), job(2).gpus(2).gpu_type("A100").limit(1e5)],
        ),
        starts={2: "x"},
        waits={1: R.RESERVED},
    ),
    Rule(
        "a quota refusal is the reason when GPUs are idle but not lent",
        snapshot(nodes=one_node(4), queued=[job(1).gpus(2).team("b")]),
        starts={},
        waits={1: (R.QUOTA, "guaranteed to other teams")},
        policy=policy(team("a", quota={"H100": 3}, max_lend=0), team("b")),
    ),
    Rule(
        "busy GPUs, not the quota, are the reason when nothing is idle anyway",
        snapshot(
            nodes=one_node(2),
            running=[running(100, "n1", 0, 1, team="c", priority="high")],
            queued=[job(1).team("b")],
        ),
        starts={},
        waits={1: R.RESERVED},
        policy=policy(team("a", quota={"H100": 2}, max_lend=0), team("b"), team("c")),
    ),
]


@pytest.mark.parametrize("rule", params(BACKFILL))
def test_backfill_and_reasons(rule: Rule) -> None:
    check(rule)


def test_backfilled_jobs_never_delay_the_reserved_job() -> None:
    """Run the backfill case forward: job 1 starts at its estimated start, not later."""
    queued = [job(1).gpus(8).build(), job(2).gpus(2).limit(900).build(), job(3).limit(50_000).build()]
    plan = decide(snapshot(nodes=BACKFILL_NODES, running=BACKFILL_RUNNING, queued=queued), now=NOW)
    estimate = plan.waiting[1].estimated_start
    assert estimate == 2000.0
    started = {s.job_id for s in plan.starts}
    assert started == {2, 3}
    # at the estimate, every running job that started by then and is due has ended
    still = [r for r in BACKFILL_RUNNING if r.job_id != 100]
    plan2 = decide(snapshot(nodes=BACKFILL_NODES, running=still, queued=[queued[0]]), now=estimate)
    assert [s.job_id for s in plan2.starts] == [1]


# ---- ageing and baselines ----------------------------------------------------------------------

WEEK = LAS_STARVATION_AGE_S
AGEING = [
    Rule(
        "a job that waited the starvation age (the default's: a week) goes first, whatever its class",
        snapshot(nodes=one_node(1), queued=[job(1).priority("low").at(0), job(2).priority("critical").at(WEEK - 400)]),
        starts={1: ANY},
        waits={2: R.RESERVED},
        now=WEEK,
    ),
    Rule(
        "just short of the starvation age, class still wins",
        snapshot(nodes=one_node(1), queued=[job(1).priority("low").at(1), job(2).priority("critical").at(WEEK - 400)]),
        starts={2: ANY},
        waits={1: R.RESERVED},
        now=WEEK,
    ),
    Rule(
        "age ordering's starvation age is a day",
        snapshot(nodes=one_node(1), queued=[job(1).priority("low").at(0), job(2).priority("critical").at(86_000)]),
        starts={1: ANY},
        waits={2: R.RESERVED},
        policy=age_policy(),
        now=86_400.0,
    ),
    Rule(
        "aged jobs keep their submission order and ignore fair share",
        snapshot(
            nodes=one_node(1),
            queued=[job(1).team("a").at(0), job(2).team("b").at(10)],
            usage={"a": 1e12},
        ),
        starts={1: ANY},
        waits={2: R.RESERVED},
        policy=policy(team("a"), team("b"), starvation_age_s=100),
        now=200.0,
    ),
]


@pytest.mark.parametrize("rule", params(AGEING))
def test_ageing(rule: Rule) -> None:
    check(rule)


BASELINES = [
    Rule(
        "fifo: submission order, classes ignored",
        snapshot(nodes=one_node(1), queued=[job(1).priority("low").at(0), job(2).priority("high").at(1)]),
        starts={1: ANY},
        waits={2: R.RESERVED},
        policy=fifo_policy(),
    ),
    Rule(
        "fifo: usage ignored",
        snapshot(nodes=one_node(1), queued=[job(1).team("a").at(0), job(2).team("b").at(1)], usage={"a": 1e12}),
        starts={1: ANY},
        waits={2: R.RESERVED},
        policy=fifo_policy(),
    ),
    Rule(
        "fifo: no preemption",
        snapshot(nodes=one_node(1), running=[running(100, "n1", 0, priority="low")], queued=[job(1).priority("high")]),
        starts={},
        waits={1: R.RESERVED},
        policy=fifo_policy(),
    ),
    Rule(
        "fifo: no backfill past the first in line",
        snapshot(nodes=BACKFILL_NODES, running=BACKFILL_RUNNING, queued=[job(1).gpus(8), job(2).limit(5000)]),
        starts={},
        waits={1: R.RESERVED, 2: R.BEHIND_RESERVATION},
        policy=fifo_policy(),
    ),
    Rule(
        "priority: class first, then submission order",
        snapshot(
            nodes=one_node(1),
            queued=[job(1).priority("low").at(0), job(2).at(2), job(3).at(1).team("x"), job(4).priority("high").at(3)],
            usage={"x": 1e12},
        ),
        starts={4: ANY},
        waits={3: R.RESERVED, 2: R.RESOURCES, 1: R.RESOURCES},
        policy=priority_policy(),
    ),
    Rule(
        "priority: no preemption",
        snapshot(nodes=one_node(1), running=[running(100, "n1", 0, priority="low")], queued=[job(1).priority("high")]),
        starts={},
        waits={1: R.RESERVED},
        policy=priority_policy(),
    ),
    Rule(
        "default: priority preemption is on",
        snapshot(nodes=one_node(1), running=[running(100, "n1", 0, priority="low")], queued=[job(1).priority("high")]),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({100}),
        policy=Policy(),
    ),
]


@pytest.mark.parametrize("rule", params(BASELINES))
def test_baselines(rule: Rule) -> None:
    check(rule)


def test_default_policy_is_one_team_preemption_on_30s_grace() -> None:
    p = Policy()
    assert list(p.teams) == ["default"]
    assert p.preemption.enabled and p.preemption.grace_period_s == 30.0
    assert p.fair_share and p.priorities and p.backfill
    assert not p.preemptible(next(iter(p.preemption.protected_classes)))
    for base in (fifo_policy(), priority_policy()):
        assert not base.preemption.enabled and not base.backfill and not base.fair_share
    assert not fifo_policy().priorities and priority_policy().priorities


def test_a_gang_reservation_waits_for_its_gpus_on_each_of_its_nodes() -> None:
    """`--nodes 2` of 4 GPUs: 2 GPUs on each of 2 nodes. Each node has 1 of its 2 GPUs free; n1's
    other GPU is back at 1100, n2's at 5000, n3's at 6000. The GPUs come back 4 in all at 1100,
    but 2 on two nodes only at 5000 (n1 and n2): that is its reservation, held on n1 and n2
    alone, so a long job starts on n3 and, at 5000, the gang still starts."""
    nodes = [node(n).gpus(2) for n in ("n1", "n2", "n3")]
    busy = [
        running(100, "n1", 0, limit=NOW + 100, priority="high"),
        running(101, "n2", 0, limit=5000, priority="high"),
        running(102, "n3", 0, limit=6000, priority="high"),
    ]
    gang = job(1).gpus(4).nodes(2).build()
    long = job(2).limit(20_000).build()
    plan = decide(snapshot(nodes=nodes, running=busy, queued=[gang, long]), now=NOW)
    wait = plan.waiting[1]
    assert wait.reason is R.RESERVED and "on n1, n2 are held" in sentence(wait), wait
    assert wait.estimated_start == 5000.0
    assert [(s.job_id, s.allocation.slices[0].node) for s in plan.starts] == [(2, "n3")]
    # At its reserved time, with every job still within its limit running, the gang starts.
    at = wait.estimated_start
    still = [r for r in busy if r.started_at + (r.time_limit_s or 0) > at]
    still += [RunningJob(s.job_id, s.allocation, started_at=NOW, time_limit_s=long.time_limit_s) for s in plan.starts]
    later = decide(snapshot(nodes=nodes, running=still, queued=[gang]), now=at)
    assert [s.job_id for s in later.starts] == [1], later


# ---- CPU-only jobs (gpus 0; issue 26) --------------------------------------------------------


def cpu_job(job_id: int, node_name: str, cpus: float, mem_mb: int = 0, **kw: Any) -> RunningJob:
    """A running CPU-only job: a slice with no GPU, holding `cpus` and `mem_mb` on `node_name`."""
    return RunningJob(job_id, Allocation((NodeSlice(node_name, (), cpus=cpus, host_memory_mb=mem_mb),)), **kw)


GPU_NODE = node("n1").gpus(8).host(cpus=32, memory_mb=64_000)
CPU_NODE = node("c1").host(cpus=16, memory_mb=32_000)  # no GPUs at all
RESERVED_CPUS = node("a").gpus(8).host(cpus=16)
HOLDS_CPUS = cpu_job(100, "a", 12, started_at=0, time_limit_s=2000)

CPU_ONLY = [
    Rule(
        "a CPU-only job lands on the node without GPUs, holding no GPU; a GPU job takes the GPUs",
        snapshot(nodes=[GPU_NODE, CPU_NODE], queued=[job(1).gpus(0).host(cpus=4), job(2).gpus(8)]),
        starts={1: (("c1", ()),), 2: (("n1", (0, 1, 2, 3, 4, 5, 6, 7)),)},
    ),
    Rule(
        "with the CPU node full it takes a GPU node's CPUs, and never its GPUs",
        snapshot(
            nodes=[GPU_NODE, CPU_NODE],
            running=[cpu_job(100, "c1", 16)],
            queued=[job(1).gpus(0).host(cpus=4), job(2).gpus(8).host(cpus=28)],
        ),
        starts={1: (("n1", ()),), 2: (("n1", (0, 1, 2, 3, 4, 5, 6, 7)),)},
    ),
    Rule(
        "short of CPUs everywhere: waits CPUS; short of memory: MEMORY; a later one that fits starts",
        snapshot(
            nodes=[GPU_NODE, CPU_NODE],
            running=[cpu_job(100, "c1", 16), cpu_job(101, "n1", 30, 40_000)],
            queued=[
                job(1).gpus(0).host(cpus=4),
                job(2).gpus(0).host(cpus=1, mem_mb=40_000),
                job(3).gpus(0).host(cpus=2, mem_mb=20_000),
            ],
        ),
        starts={3: (("n1", ()),)},
        waits={1: (R.CPUS, "no node has 4 CPU core(s) free"), 2: (R.MEMORY, "40000 MiB of host memory")},
    ),
    Rule(
        "more than any node has: no fit, naming the largest node",
        snapshot(nodes=[GPU_NODE, CPU_NODE], queued=[job(1).gpus(0).host(cpus=64)]),
        starts={},
        waits={
            1: (
                R.NO_FIT,
                "asking for 64 CPU core(s) and 0 MiB of host memory fits no node (the most on one node: 32 cores",
            )
        },
    ),
    Rule(
        "no node accounts CPUs or memory: no fit (it would pack without bound)",
        snapshot(nodes=[node("n1").gpus(8)], queued=[job(1).gpus(0).host(cpus=1)]),
        starts={},
        waits={
            1: (R.NO_FIT, "(the most on one node: 0 cores, 0 MiB; a node that states neither takes no CPU-only job)")
        },
    ),
    Rule(
        "a node list and an exclusion are honoured",
        snapshot(
            nodes=[GPU_NODE, CPU_NODE],
            queued=[
                job(1).gpus(0).host(cpus=1).select(nodelist=["n1"]),
                job(2).gpus(0).host(cpus=1).select(exclude=["c1"]),
            ],
        ),
        starts={1: "n1", 2: "n1"},
    ),
    Rule(
        "its CPUs count in a GPU job's reservation: it holds them until its end (2000)",
        snapshot(nodes=[RESERVED_CPUS], running=[HOLDS_CPUS], queued=[job(1).gpus(8).host(cpus=8)]),
        starts={},
        waits={1: (R.RESERVED, "with 8 CPU(s) on a are held")},
        estimated={1: 2000.0},
    ),
    Rule(
        "behind a reservation holding CPUs: a long CPU-only job keeps off them, a short one passes",
        snapshot(
            nodes=[RESERVED_CPUS],
            running=[HOLDS_CPUS],
            queued=[
                job(1).gpus(8).host(cpus=8),
                job(2).gpus(0).host(cpus=4).limit(5000),
                job(3).gpus(0).host(cpus=4).limit(500),
            ],
        ),
        starts={3: (("a", ()),)},
        waits={1: R.RESERVED, 2: (R.CPUS, "held for a job first in line")},
        estimated={1: 2000.0},
    ),
    Rule(
        "in strict order (no backfill) even a short CPU-only job keeps off the reserved CPUs",
        snapshot(
            nodes=[RESERVED_CPUS],
            running=[HOLDS_CPUS],
            queued=[job(1).gpus(8).host(cpus=8), job(3).gpus(0).host(cpus=4).limit(500)],
        ),
        starts={},
        waits={1: R.RESERVED, 3: R.CPUS},
        policy=policy(backfill=False),
    ),
    Rule(
        "preemption frees GPUs: a high GPU job takes the low GPU job, never the low CPU-only job",
        snapshot(
            nodes=[GPU_NODE],
            running=[cpu_job(100, "n1", 8, priority=Priority.LOW), running(101, "n1", *range(8), priority="low")],
            queued=[job(1).gpus(8).priority("high")],
        ),
        starts={},
        waits={1: R.PREEMPTING},
        preempted=frozenset({101}),
    ),
    Rule(
        "a high CPU-only job preempts no one: it waits for CPUs a low GPU job holds",
        snapshot(
            nodes=[node("n1").gpus(8).host(cpus=8)],
            running=[RunningJob(101, Allocation((NodeSlice("n1", (0,), cpus=8),)), priority=Priority.LOW)],
            queued=[job(1).gpus(0).host(cpus=2).priority("high")],
        ),
        starts={},
        waits={1: R.CPUS},
    ),
]


@pytest.mark.parametrize("rule", params(CPU_ONLY))
def test_cpu_only(rule: Rule) -> None:
    check(rule)
