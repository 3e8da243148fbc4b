"""Preemption for jobs limited to some nodes (issue 16): a share, a `--nodes M` gang, a job
larger than a node, each with `--constraint`/`--nodelist`/`--exclude` or a pool, preempts only
where it may land; and `--exclusive` jobs preempt whole nodes' worth and get a backfill
reservation. Each of these waited (or preempted nowhere useful) before."""

from __future__ import annotations

import pytest

from gpucluster.core.policy import Policy, Preemption
from gpucluster.core.pools import Pool
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.types import Priority
from gpucluster.waits_text import sentence

from .builders import job, node, running, shared, snapshot, spread

NOW = 10_000.0
PRIORITY = Policy(preemption=Preemption(enabled=True, grace_period_s=30.0, min_runtime_s=0.0))


def _victims(plan: object) -> set[int]:
    return {p.job_id for p in plan.preemptions}  # type: ignore[attr-defined]


def _full_low(nodes: list[str], per: int = 2, cheap_first: str | None = None) -> list:  # type: ignore[type-arg]
    """One low job per GPU; those on `cheap_first` (if given) lost the least work (cheapest)."""
    out = []
    for k, nd in enumerate(nodes):
        for i in range(per):
            started = NOW - (10 if nd == cheap_first else 1000)
            out.append(running(100 + 10 * k + i, nd, i, priority="low", started_at=started))
    return out


def test_a_share_with_a_constraint_preempts_only_on_a_matching_node() -> None:
    # The cheapest victims are on n1 (no ib): a half-GPU job that needs ib must take one on n2.
    snap = snapshot(
        nodes=[node("n1").gpus(2), node("n2").gpus(2).labels("ib")],
        running=_full_low(["n1", "n2"], cheap_first="n1"),
        queued=[job(1).gpus(0.5).priority("high").select(constraint="ib")],
    )
    plan = decide(snap, PRIORITY, now=NOW)
    assert plan.waiting[1].reason is WaitReason.PREEMPTING, plan.waiting[1]
    assert len(_victims(plan)) == 1 and _victims(plan) <= {110, 111}


def test_a_share_preempts_a_share_on_an_allowed_node() -> None:
    snap = snapshot(
        nodes=[node("n1").gpus(1), node("n2").gpus(1)],
        running=[
            shared(90, "n1", 0, 0.5, priority="low", started_at=NOW - 10),
            shared(91, "n1", 0, 0.5, priority="low", started_at=NOW - 10),
            shared(92, "n2", 0, 0.5, priority="low", started_at=NOW - 900),
            shared(93, "n2", 0, 0.5, priority="low", started_at=NOW - 900),
        ],
        queued=[job(1).gpus(0.5).priority("high").select(exclude=["n1"])],
    )
    plan = decide(snap, PRIORITY, now=NOW)
    assert len(_victims(plan)) == 1 and _victims(plan) <= {92, 93}


def test_a_gang_with_a_nodelist_preempts_on_its_nodes() -> None:
    # A 2x2 gang limited to n2, n3: the cheap victims on n1 are of no use to it.
    snap = snapshot(
        nodes=[node(f"n{i}").gpus(2) for i in (1, 2, 3)],
        running=_full_low(["n1", "n2", "n3"], cheap_first="n1"),
        queued=[job(1).gpus(4).nodes(2).priority("high").select(nodelist=["n2", "n3"])],
    )
    plan = decide(snap, PRIORITY, now=NOW)
    assert _victims(plan) == {110, 111, 120, 121}
    assert plan.waiting[1].reason is WaitReason.PREEMPTING


def test_a_job_larger_than_a_node_with_an_exclude_preempts_on_the_rest() -> None:
    snap = snapshot(
        nodes=[node(f"n{i}").gpus(2) for i in (1, 2, 3)],
        running=_full_low(["n1", "n2", "n3"], cheap_first="n1"),
        queued=[job(1).gpus(4).priority("high").select(exclude=["n1"])],
    )
    plan = decide(snap, PRIORITY, now=NOW)
    assert _victims(plan) == {110, 111, 120, 121}


def test_a_pool_keeps_victims_to_the_pool_a_job_may_use() -> None:
    # The gpu pool is closed to team b: its share must find its victim outside it.
    snap = snapshot(
        nodes=[node("n1").gpus(1), node("n2").gpus(1)],
        running=[
            running(90, "n1", 0, priority="low", started_at=NOW - 10),
            running(91, "n2", 0, priority="low", started_at=NOW - 900),
        ],
        queued=[job(1).gpus(0.5).priority("high").team("b")],
    )
    policy = Policy(
        preemption=PRIORITY.preemption, pools=(Pool("private", nodes=frozenset({"n1"}), teams=frozenset({"a"})),)
    )
    plan = decide(snap, policy, now=NOW)
    assert _victims(plan) == {91}


def test_victims_span_nodes_the_job_may_use_and_a_spanning_victim_counts_there_only() -> None:
    # Job 90 spans n1 and n2; only its GPUs on n2 count for a job limited to n2.
    snap = snapshot(
        nodes=[node("n1").gpus(2), node("n2").gpus(2)],
        running=[
            spread(90, {"n1": [0, 1], "n2": [0]}, priority="low", started_at=NOW - 10),
            running(91, "n2", 1, priority="low", started_at=NOW - 900),
        ],
        queued=[job(1).gpus(0.5).priority("high").select(nodelist=["n2"])],
    )
    plan = decide(snap, PRIORITY, now=NOW)
    assert _victims(plan) == {90}  # the cheapest, and it does free a GPU on n2


# ---- exclusive ---------------------------------------------------------------------------------


def test_an_exclusive_job_preempts_every_job_on_one_node() -> None:
    # n1 holds two cheap low jobs, n2 one dear one: fewest victims wins (n2), and all of it.
    snap = snapshot(
        nodes=[node("n1").gpus(4), node("n2").gpus(4)],
        running=[
            running(90, "n1", 0, priority="low", started_at=NOW - 10),
            running(91, "n1", 1, priority="low", started_at=NOW - 10),
            running(92, "n2", 0, 1, 2, priority="low", started_at=NOW - 900),
        ],
        queued=[job(1).gpus(1).priority("high").exclusive()],
    )
    plan = decide(snap, PRIORITY, now=NOW)
    assert _victims(plan) == {92}
    assert plan.waiting[1].reason is WaitReason.PREEMPTING


def test_an_exclusive_job_never_preempts_a_node_a_higher_job_shares() -> None:
    snap = snapshot(
        nodes=[node("n1").gpus(4), node("n2").gpus(4)],
        running=[
            running(90, "n1", 0, priority="low"),
            running(91, "n1", 1, priority="critical"),
            running(92, "n2", 0, priority="low"),
            running(93, "n2", 1, priority="low"),
        ],
        queued=[job(1).gpus(2).priority("high").exclusive()],
    )
    plan = decide(snap, PRIORITY, now=NOW)
    assert _victims(plan) == {92, 93}


def test_an_exclusive_gang_empties_its_count_of_nodes() -> None:
    snap = snapshot(
        nodes=[node(f"n{i}").gpus(2) for i in (1, 2, 3)],
        running=_full_low(["n1", "n2", "n3"], per=1, cheap_first="n3"),
        queued=[job(1).gpus(2).nodes(2).priority("high").exclusive()],
    )
    plan = decide(snap, PRIORITY, now=NOW)
    assert len(_victims(plan)) == 2 and 120 in _victims(plan)  # n3's job is the cheapest


def test_an_exclusive_job_gets_a_backfill_reservation_on_a_whole_node() -> None:
    # n1 frees one GPU at +50 but is busy until +100; n2 frees everything at +80.
    snap = snapshot(
        nodes=[node("n1").gpus(2), node("n2").gpus(2)],
        running=[
            running(90, "n1", 0, started_at=NOW, limit=50),
            running(91, "n1", 1, started_at=NOW, limit=100),
            running(92, "n2", 0, 1, started_at=NOW, limit=80),
        ],
        queued=[job(1).gpus(1).exclusive(), job(2).gpus(1).limit(10_000)],
    )
    plan = decide(snap, Policy(backfill=True, default_time_limit_s=3600), now=NOW)
    wait = plan.waiting[1]
    assert wait.reason is WaitReason.RESERVED, wait
    assert wait.estimated_start == NOW + 80 and "on n2" in sentence(wait)


@pytest.mark.parametrize("nodes", [None, 2])
def test_an_exclusive_job_over_nodes_is_reserved_when_its_last_node_empties(nodes: int | None) -> None:
    snap = snapshot(
        nodes=[node(f"n{i}").gpus(2) for i in (1, 2, 3)],
        running=[
            running(90, "n1", 0, started_at=NOW, limit=30),
            running(91, "n2", 0, 1, started_at=NOW, limit=60),
            running(92, "n3", 1, started_at=NOW, limit=90),
        ],
        queued=[(job(1).gpus(4).nodes(nodes) if nodes else job(1).gpus(4)).exclusive()],
    )
    wait = decide(snap, Policy(backfill=True), now=NOW).waiting[1]
    assert wait.reason is WaitReason.RESERVED and wait.estimated_start == NOW + 60, wait


def test_no_class_below_means_no_victims_for_an_exclusive_job() -> None:
    snap = snapshot(
        nodes=[node("n1").gpus(2)],
        running=[running(90, "n1", 0, priority=Priority.HIGH)],
        queued=[job(1).gpus(1).priority("high").exclusive()],
    )
    assert not decide(snap, PRIORITY, now=NOW).preemptions


def test_an_exclusive_job_skips_a_node_whose_other_model_is_busy() -> None:
    # n1 holds H100s and A100s: its A100 job (not a victim for an H100 job) keeps n1 busy.
    mixed = node("n1").gpus(2, "H100").gpus(2, "A100")
    snap = snapshot(
        nodes=[mixed, node("n2").gpus(2, "H100")],
        running=[
            running(90, "n1", 0, priority="low", started_at=NOW - 10),
            running(91, "n1", 2, priority="critical"),
            running(92, "n2", 0, 1, priority="low", started_at=NOW - 900),
        ],
        queued=[job(1).gpus(1).gpu_type("H100").priority("high").exclusive()],
    )
    plan = decide(snap, PRIORITY, now=NOW)
    assert _victims(plan) == {92}
