"""Quotas per node pool (issue 16): `pools: {name: {..., quotas: {team: GPUs}}}` caps the GPUs a
team's jobs hold on the pool's nodes, enforced like a team quota: a job that would pass it is
kept off the pool (it starts elsewhere if it can), waits with a QUOTA wait naming the pool when
only the pool has room, and preempts nothing there for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster.core.policy import Policy, Preemption
from gpucluster.core.pools import Pool
from gpucluster.core.reasons import WaitReason
from gpucluster.core.scheduler import decide
from gpucluster.policyfile import PolicyFileError, load_policy

from .builders import job, node, running, snapshot

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
    assert wait.reason is WaitReason.QUOTA and "pool fast" in wait.message and "2-GPU quota" in wait.message, wait
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
