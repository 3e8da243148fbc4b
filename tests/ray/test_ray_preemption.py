"""Issue 16 on Ray's nodes: a gang over exactly M nodes (`--nodes M`) preempts, as a job without
`--nodes` always did. A real `gpucluster up --ray` head on the session's Ray cluster (two worker
nodes of 2 GPUs, tests/ray/conftest.py); jobs are real processes on the raylets."""

from __future__ import annotations

from gpucluster.client import Client
from gpucluster.models import Job
from tests.e2e.headproc import wait_for
from tests.ray.conftest import RayHead


def _state(c: Client, job_id: int, *states: str, timeout: float = 60) -> Job:
    return wait_for(
        lambda: (j := c.job(job_id)).state.value in states and j,
        timeout=timeout,
        interval=0.2,
        what=f"job {job_id} in {states}",
    )


def _first_node(c: Client, job_id: int) -> str:
    """The node of the job's first start, from its event ("started on NODE GPUs 0")."""
    started = next(e.reason for e in c.job(job_id).events if e.state.value == "running")
    return started.split(" on ", 1)[1].split()[0]


def test_a_gang_over_two_nodes_preempts_one_low_job_on_each(ray_head: RayHead) -> None:
    """Measured: with every GPU held by low jobs, a high `--nodes 2` job waited for ever (it was
    never a preemptor); now it stops the cheapest low job on each node, runs, and they requeue."""
    with ray_head.client() as c:
        lows = [c.submit(["sleep", "3600"], gpus=1, priority="low", name=f"low-{i}").id for i in range(4)]
        try:
            for j in lows:
                _state(c, j, "running")
            assert len({_first_node(c, j) for j in lows}) == 2
            high = c.submit(["sh", "-c", "echo gang on $GPUCLUSTER_NODE"], gpus=2, nodes=2, priority="high").id
            done = _state(c, high, "succeeded", "failed", timeout=120)
            assert done.state.value == "succeeded", done.reason
            assert len({s.node for s in done.allocation or []}) == 2
            victims = [j for j in lows if any(e.state.value == "preempted" for e in c.job(j).events)]
            assert len(victims) == 2, victims
            assert len({_first_node(c, v) for v in victims}) == 2  # one on each node
            for v in victims:
                reason = next(e.reason for e in c.job(v).events if e.state.value == "preempted")
                assert f"preempted by job {high}" in reason
                _state(c, v, "running", timeout=120)  # requeued, and back once the gang is done
        finally:
            for j in lows:
                if not c.job(j).state.terminal:
                    c.cancel(j)
            for j in lows:
                _state(c, j, "cancelled", "succeeded", "failed")
