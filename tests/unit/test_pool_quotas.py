"""Quotas per node pool (issue 16): `pools: {name: {..., quotas: {team: GPUs}}}` caps the GPUs a
team's jobs hold on the pool's nodes, enforced like a team quota: a job that would pass it is
kept off the pool (it starts elsewhere if it can), waits with a QUOTA wait naming the pool when
only the pool has room, and preempts nothing there for it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucluster.core.policy import Policy, Preemption
from gpucluster.core.pools import Pool
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.core.snapshot import Snapshot
from gpucluster.policyfile import PolicyFileError, load_policy
from gpucluster.waits_text import sentence

from .builders import job, node, running, snapshot
from .test_scheduler_properties import TEAMS, check_no_overcommit
from .test_scheduler_selection import labelled

NOW = 10_000.0
FAST = Pool("fast", labels=frozenset({"ib"}), quotas=(("vision", 2.0),))


def _policy(**kw: object) -> Policy:
    return Policy(pools=(FAST,), **kw)  # type: ignore[arg-type]


def _started(plan: object) -> dict[int, set[str]]:
    return {s.job_id: {sl.node for sl in s.allocation.slices} for s in plan.starts}  # type: ignore[attr-defined]


def test_a_team_at_its_pool_quota_starts_off_the_pool() -> None:
    snap = snapshot(
        nodes=[node("f1").gpus(4).labels("ib"), node("s1").gpus(4)],
        queued=[job(i).gpus(1).team("vision") for i in (1, 2, 3)],
    )
    plan = decide(snap, _policy())
    on_pool = [j for j, nodes in _started(plan).items() if nodes == {"f1"}]
    assert len(plan.starts) == 3 and len(on_pool) <= 2


def test_a_job_only_the_pool_could_host_waits_naming_the_pool() -> None:
    snap = snapshot(
        nodes=[node("f1").gpus(4).labels("ib"), node("s1").gpus(4)],
        running=[running(90, "f1", 0, 1, team="vision"), running(91, "s1", 0, 1, 2, 3, team="nlp")],
        queued=[job(1).gpus(1).team("vision"), job(2).gpus(1).team("nlp")],
    )
    plan = decide(snap, _policy())
    wait = plan.waiting[1]
    assert wait.reason is WaitReason.QUOTA and "pool fast" in sentence(wait) and "2-GPU quota" in sentence(wait), wait
    assert _started(plan) == {2: {"f1"}}  # another team (no quota there) takes the room


def test_shares_count_and_other_teams_are_unlimited() -> None:
    snap = snapshot(
        nodes=[node("f1").gpus(5).labels("ib")],
        queued=[job(1).gpus(2).team("vision"), job(2).gpus(0.5).team("vision"), job(3).gpus(2).team("nlp")],
    )
    plan = decide(snap, _policy())
    assert set(_started(plan)) == {1, 3} and plan.waiting[2].reason is WaitReason.QUOTA, plan.waiting


def test_a_team_at_its_pool_quota_preempts_nothing_in_the_pool() -> None:
    policy = _policy(preemption=Preemption(enabled=True, min_runtime_s=0.0))
    snap = snapshot(
        nodes=[node("f1").gpus(3).labels("ib")],
        running=[running(90, "f1", 0, 1, team="vision"), running(91, "f1", 2, team="nlp", priority="low")],
        queued=[job(1).gpus(1).team("vision").priority("high")],
    )
    plan = decide(snap, policy, now=NOW)
    assert not plan.preemptions and plan.waiting[1].reason is not WaitReason.PREEMPTING, plan.waiting[1]


def _load(tmp_path: Path, text: str) -> Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return load_policy(path)


def test_the_policy_file_reads_pool_quotas_and_refuses_bad_ones(tmp_path: Path) -> None:
    text = "teams: {vision: {}, nlp: {}}\npools:\n  fast: {labels: [ib], quotas: {vision: 2}}\n"
    (pool,) = _load(tmp_path, text).pools
    assert pool.quota("vision") == 2.0 and pool.quota("nlp") is None
    for bad, says in [
        ("teams: {vision: {}}\npools: {fast: {labels: [ib], quotas: {nlp: 2}}}\n", "not under teams"),
        ("pools: {fast: {labels: [ib], quotas: {vision: -1}}}\n", "0 or more"),
        ("pools: {fast: {labels: [ib], teams: [nlp], quotas: {vision: 1}}}\n", "do not admit"),
    ]:
        with pytest.raises(PolicyFileError, match=says):
            _load(tmp_path, bad)


# ---- property: a pool's quota is never passed by the plan's starts -----------------------------


@st.composite
def with_pool_quotas(draw: st.DrawFn) -> tuple[Snapshot, Policy, Pool]:
    snap, policy = draw(labelled())
    names = sorted(n.name for n in snap.nodes)
    members = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
    quotas = draw(st.dictionaries(st.sampled_from(TEAMS), st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]), min_size=1))
    pool = Pool("p", nodes=frozenset(members), quotas=tuple(sorted(quotas.items())))
    return snap, replace(policy, pools=(pool,)), pool


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(with_pool_quotas())
def test_starts_never_take_a_team_past_its_pool_quota(scenario: tuple[Snapshot, Policy, Pool]) -> None:
    snap, policy, pool = scenario
    plan = decide(snap, policy, now=NOW)
    check_no_overcommit(snap, plan)
    queued = {j.job_id: j for j in snap.queued}

    def on_pool(allocation: object) -> float:
        return sum(len(s.gpu_indices) * s.share for s in allocation.slices if s.node in pool.nodes)  # type: ignore[attr-defined]

    for team, quota in pool.quotas:
        before = sum(on_pool(r.allocation) for r in snap.running if r.team == team)
        started = sum(on_pool(s.allocation) for s in plan.starts if queued[s.job_id].team == team)
        # Jobs running already may be over (the quota came later); the plan adds nothing then.
        assert started == 0 or before + started <= quota + 1e-9, (team, quota, before, started)
