"""End to end (issue 16's leftovers) on a live head with real processes: a share limited by
`--constraint` and an `--exclusive` job preempt lower jobs instead of waiting forever; a pool's
per-team quota keeps a team's second job waiting with a reason naming the pool; an elastic job
above its minimum is shrunk (and restarts smaller at once) rather than a cheaper job stopped
whole; an exclusive job's estimated start is when its node empties, not when one GPU frees.
Each failed on the code before: the jobs waited, or the wrong job was stopped, or the estimate
said "now"."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.headproc import HeadProcess, cli, wait_for
from tests.e2e.test_jobs import PY, finished, running
from tests.e2e.test_scheduler import TRAP


def _gpus(job: object) -> int:
    return sum(len(s.gpu_indices) for s in job.allocation)  # type: ignore[attr-defined]


def test_a_share_with_a_constraint_and_an_exclusive_job_preempt_lower_jobs(
    head_factory: type[HeadProcess], tmp_path: Path
) -> None:
    head = head_factory(tmp_path / "data", gpus=2, extra_args=("--label", "ib")).start()
    with head.client() as c:
        low = c.submit([PY, "-c", TRAP, "600"], gpus=2, priority="low", name="low").id
        running(head, low)
        share = c.submit([PY, "-c", "print('share ran')"], gpus=0.5, priority="high", constraint="ib").id
        done = finished(head, share, timeout=60)  # before: "waits" for ever, never preempting
        assert done.state.value == "succeeded" and c.logs(share).strip() == "share ran"
        events = c.job(low).events
        preempted = [e for e in events if e.state.value == "preempted"]
        assert preempted and f"preempted by job {share}" in preempted[0].reason, (events, c.job(share))
        # The low job comes back; an exclusive high job then takes the node from it.
        running(head, low, timeout=60)
        wait_for(lambda: c.job(low).attempt == 2, what="the low job's second attempt")
        alone = c.submit([PY, "-c", "print('alone')"], gpus=1, priority="high", exclusive=True).id
        done = finished(head, alone, timeout=60)
        assert done.state.value == "succeeded" and c.logs(alone).strip() == "alone"
        preempted = [e for e in c.job(low).events if e.state.value == "preempted"]
        assert len(preempted) == 2 and f"preempted by job {alone}" in preempted[1].reason
        c.cancel(low)
        finished(head, low)


def test_a_pool_quota_holds_a_teams_second_job_and_says_which_pool(
    head_factory: type[HeadProcess], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("teams: {a: {}, b: {}}\npools:\n  fast: {nodes: [node0], quotas: {a: 1}}\n")
    head = head_factory(tmp_path / "data", gpus=4, extra_args=("--policy", str(policy))).start()
    with head.client() as c:
        first = c.submit(["sleep", "120"], gpus=1, team="a").id
        running(head, first)
        second = c.submit(["true"], gpus=1, team="a").id
        other = c.submit(["true"], gpus=1, team="b").id
        assert finished(head, other, timeout=60).state.value == "succeeded"  # team b has no quota there
        j = wait_for(lambda: (j := c.job(second)).wait_reason and j, 60, what="a cycle to consider it")
        assert j.state.value == "queued" and j.wait_reason == "quota", (j.state, j.wait_reason)
        assert "pool fast" in (j.reason or "") and "1-GPU quota" in (j.reason or ""), j.reason
        assert c.policy().pools[0].quotas == {"a": 1.0}
        shown = cli(head, "policy", "show").stdout
        assert "pool fast: node0; for every team, every class; quotas a 1 GPUs" in shown, shown
        c.cancel(first)
        assert finished(head, second, timeout=60).state.value == "succeeded"


def test_an_elastic_job_is_shrunk_rather_than_a_cheaper_job_stopped(
    head_factory: type[HeadProcess], tmp_path: Path
) -> None:
    head = head_factory(tmp_path / "data", gpus=6).start()
    with head.client() as c:
        elastic = c.submit([PY, "-c", TRAP, "300"], gpus="2..4", priority="low", name="elastic").id
        assert _gpus(running(head, elastic)) == 4
        wait_for(lambda: "started" in c.logs(elastic), what="the elastic job to start")
        cheap = c.submit([PY, "-c", TRAP, "300"], gpus=2, priority="low", name="cheap").id
        running(head, cheap)  # started last: the least work lost, the victim by cost alone
        high = c.submit(["sleep", "120"], gpus=2, priority="high").id
        running(head, high, timeout=60)
        # The elastic job gave up its GPUs and came back on the 2 left; the cheap job ran on.
        again = wait_for(
            lambda: (j := c.job(elastic)).attempt == 2 and j.state.value == "running" and j, 60, what="a restart"
        )
        assert _gpus(again) == 2
        resized = [e for e in again.events if e.state.value == "preempted"]
        assert resized and resized[0].reason.startswith("resized: shrinking from 4 GPUs"), resized
        cheap_job = c.job(cheap)
        assert cheap_job.attempt == 1 and cheap_job.state.value == "running"
        for job_id in (elastic, cheap, high):
            c.cancel(job_id)
            finished(head, job_id)


def test_an_exclusive_jobs_estimate_is_when_its_node_empties(head_factory: type[HeadProcess], tmp_path: Path) -> None:
    head = head_factory(tmp_path / "data", gpus=4).start()
    with head.client() as c:
        short = c.submit(["sleep", "300"], gpus=1, time_limit="2m").id
        long = c.submit(["sleep", "300"], gpus=1, time_limit="10m").id
        started = running(head, long).started_at
        running(head, short)
        alone = c.submit(["true"], gpus=1, exclusive=True).id
        # Two GPUs are free now, but the node is not: it empties when the 10-minute job ends.
        j = wait_for(lambda: (j := c.job(alone)).estimated_start is not None and j, 60, what="an estimate")
        assert started is not None and j.estimated_start is not None
        assert abs(j.estimated_start - (started + 600)) < 60, (j.estimated_start, started)
        for job_id in (short, long, alone):
            c.cancel(job_id)
            finished(head, job_id)
