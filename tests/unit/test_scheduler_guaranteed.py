"""Whether a queued job is within its team's guaranteed quota is answered for that job's own
shape: a node selection (or CPUs, host memory) changes which models could host it, so two
jobs of one team and GPU count may differ, and the answer must not depend on which was asked
first (`_Cycle._guaranteed`, kept per cycle)."""

from __future__ import annotations

from gpucluster.core.scheduler import _Cycle

from .builders import job, node, policy, snapshot, team

A100_MB = 40 * 1024


def _answers(first: int, second: int) -> dict[int, bool]:
    jobs = {
        1: job(1).team("t").select(nodelist=["h1"]).build(),  # only the H100 node: no quota there
        2: job(2).team("t").build(),  # any model: within the A100 quota
    }
    snap = snapshot(
        nodes=[node("a1").gpus(2, model="A100", memory_mb=A100_MB), node("h1").gpus(2)], queued=jobs.values()
    )
    cycle = _Cycle(snap, policy(team("t", quota={"A100": 1})), 0.0)
    return {i: cycle._guaranteed(jobs[i]) for i in (first, second)}


def test_the_answer_is_each_jobs_own_whichever_is_asked_first() -> None:
    assert _answers(1, 2) == {1: False, 2: True}
    assert _answers(2, 1) == {1: False, 2: True}
